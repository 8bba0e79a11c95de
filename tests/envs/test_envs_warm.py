"""An environment's build writes its venvs' bytecode and pytest plugin caches into the
snapshot (farm.tasks.pycache.snapshot_warm_script, run by ``run_setup``): a real build in a
real sandbox, a real venv (farm's pytest through a .pth) with a module and an entry-point
plugin of its own, and a rollout's sandbox on the snapshot whose pytest compiles nothing."""

from __future__ import annotations

import shlex
import sysconfig
import time
from pathlib import Path

import pytest

from farm.envs.config import EnvsConfig
from farm.envs.provider import EnvProvider
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.tasks.config import TasksConfig
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import prepare_workspace

PLUGIN = "farmsnap_plugin"
MODULE = "farmsnap_mod"
# a venv as a recipe's `uv venv` + `uv pip install` leaves it: no bytecode, no pytest caches
# (farm's own packages, pytest among them, seen through a .pth: no install needs the network)
_PURELIB = '$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()[\'purelib\'])")'
SETUP = [
    '"$FARM_PYTHON" -m venv --without-pip .venv && echo .venv/ >> .git/info/exclude',
    f"p={_PURELIB} && echo {shlex.quote(sysconfig.get_paths()['purelib'])} > $p/host.pth"
    f" && echo 'VALUE = 1' > $p/{MODULE}.py"
    f" && printf 'def pytest_configure(config):\\n    import {MODULE}\\n' > $p/{PLUGIN}.py"
    f" && mkdir $p/{PLUGIN}-0.1.dist-info"
    f" && printf 'Metadata-Version: 2.1\\nName: {PLUGIN}\\nVersion: 0.1\\n' > $p/{PLUGIN}-0.1.dist-info/METADATA"
    f" && printf '[pytest11]\\nfarmsnap = {PLUGIN}\\n' > $p/{PLUGIN}-0.1.dist-info/entry_points.txt"
    f" && printf '{PLUGIN}.py,,\\n' > $p/{PLUGIN}-0.1.dist-info/RECORD",  # pytest rewrites what RECORD lists
    # a repository that does not ignore its caches (a release's sdist has no .gitignore)
    "echo 'VALUE = 2' > farmsnap_repo.py && mkdir -p tests"
    " && printf 'import farmsnap_repo\\ndef test_one():\\n    assert farmsnap_repo.VALUE\\n' > tests/test_one.py",
]


def _provider(tmp_path: Path, *, warm: bool) -> tuple[EnvProvider, SandboxConfig]:
    sb = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb"), view="overlay"))
    runtime = TaskRuntime.from_config(TasksConfig(cache_dir=str(tmp_path / "tasks"), warm_pytest_caches=warm))

    async def make(spec: SandboxSpec):
        return await create_sandbox(sb, spec)

    p = EnvProvider(EnvsConfig(cache_dir=str(tmp_path / "envs")), runtime, make, labels={"run_id": "warmtest"})
    runtime.envs = p
    return p, sb


def _caches(root: Path) -> list[str]:
    return sorted(str(f.relative_to(root)) for f in root.rglob("*.pyc") if "farmsnap" in f.name)


@pytest.mark.parametrize("warm", [True, False])
async def test_a_build_writes_what_its_sandboxes_would_compile(tmp_path: Path, warm: bool) -> None:
    p, sb_cfg = _provider(tmp_path, warm=warm)
    t = Task(id="snap", instruction="x", setup_commands=SETUP, verify_commands=["true"])
    spec = await p.runtime.sandbox_spec(t, SandboxSpec(labels={"run_id": "warmtest"}))
    built_at = time.time()
    record = p.store.record((await p.identity(t)).key)
    tree = p.store.tree(record.key)
    built = _caches(tree)
    steps = [s.command for s in record.setup.steps]
    if warm:  # the venv's own module compiled, the plugin rewritten by pytest, the repository compiled
        assert any(c.endswith(f"{MODULE}.cpython-311.pyc") for c in built), built
        assert any(f"{PLUGIN}.cpython-311-pytest-" in c for c in built), built
        assert "__pycache__/farmsnap_repo.cpython-311.pyc" in built, built
        # a cache is trusted by its source's mtime in whole seconds (and size): the build ends a
        # second after its last write, so no later same-size edit shares a source's second
        newest = max(f.lstat().st_mtime for f in tree.rglob("*"))
        assert built_at - newest >= 1.0, built_at - newest
    else:
        assert built == []
    assert steps == SETUP  # farm's step is not one of the task's
    sb = await create_sandbox(sb_cfg, spec)
    try:
        ws = await prepare_workspace(sb, t, p.runtime)
        res = await sb.exec(".venv/bin/python -m pytest -q -p no:cacheprovider tests", cwd=ws.workdir, timeout=120)
        assert res.exit_code == 0 and "1 passed" in res.stdout, res
        # the repository's bytecode is no part of the workspace's baseline commit (compiled after it)
        listed = await sb.exec(f"git ls-tree -r --name-only {ws.baseline_commit}", cwd=ws.workdir)
        assert listed.ok and "farmsnap_repo.py" in listed.stdout.split() and ".pyc" not in listed.stdout, listed
        # and `git status` shows the agent none of them: __pycache__ excluded, as the venv is
        status = await sb.exec("git status --porcelain", cwd=ws.workdir)
        assert status.ok and ("__pycache__" in status.stdout) is (not warm), status
        # what the rollout's pytest wrote beside the venv's modules: its sandbox's own layer
        written = _caches(Path(sb.dir) / "view" / "upper")
    finally:
        await sb.close()
    if warm:
        assert written == [], written
    else:  # without the build's caches, each sandbox compiles and rewrites them again
        assert any(f"{PLUGIN}.cpython-311-pytest-" in c for c in written), written
        assert "__pycache__/farmsnap_repo.cpython-311.pyc" in written, written
