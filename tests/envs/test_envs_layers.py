"""Layered environments with real sandboxes: one base per repository-version (the venv),
a thin instance layer per base commit on top, stacked as a sandbox's lower layers.

The repository is made here: three commits of a tiny package (c3, the newest, is the
rows' environment_setup_commit). Base setup makes a real venv with uv (no network);
instance setup installs the checkout into it as an editable path (a .pth file) and
removes a file of the base (a deletion the layer must carry)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from farm.envs.config import EnvsConfig
from farm.envs.provider import EnvBuildFailed, EnvProvider
from farm.errors import SandboxError
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.views import mounts_under
from farm.tasks.config import TasksConfig
from farm.tasks.model import GitSource, Task
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import prepare_workspace

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
BASE_SETUP = [
    "uv venv -q .venv",
    "echo base-only > .venv/stale.txt",
    "git rev-parse HEAD > .venv/built-at",
]
SETUP = [
    'echo "$PWD" > "$(echo .venv/lib/python*/site-packages)/pkg.pth"',  # the editable install of this checkout
    "rm .venv/stale.txt",
]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> dict[str, str]:
    work = tmp_path / "work"
    (work / "pkg").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    commits = []
    for i in (1, 2, 3):
        (work / "pkg" / "__init__.py").write_text(f"VERSION = {i}\n")
        git(work, "add", "-A")
        git(work, "commit", "-qm", f"c{i}")
        commits.append(git(work, "rev-parse", "HEAD"))
    mirrors = tmp_path / "mirrors"
    mirrors.mkdir()
    git(tmp_path, "clone", "-q", "--bare", str(work), str(mirrors / "o__pkg.git"))
    return {"mirrors": str(mirrors), "c1": commits[0], "c2": commits[1], "c3": commits[2]}


def instance(repo: dict, commit: str, tid: str, base_setup: list[str] | None = None, **kw) -> Task:
    return Task(id=tid, instruction="fix it", workspace=GitSource(repo="o/pkg", base_commit=repo[commit]),
                base_setup_commands=BASE_SETUP if base_setup is None else base_setup, setup_commands=SETUP,
                metadata={"version": "1", "environment_setup_commit": repo["c3"]}, verify_commands=["true"],
                **kw)  # fmt: skip


@pytest.fixture
def world(tmp_path: Path, repo):
    sb = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb"), setup_network="isolated"))
    envs = EnvsConfig(cache_dir=str(tmp_path / "envs"))

    def provider(make=None) -> EnvProvider:
        runtime = TaskRuntime.from_config(TasksConfig(cache_dir=str(tmp_path / "tc"), mirror_dir=repo["mirrors"]))
        p = EnvProvider(envs, runtime, make or (lambda spec: create_sandbox(sb, spec)), labels={"run_id": "layers"})
        runtime.envs = p
        return p

    return {"sb": sb, "provider": provider, "tmp": tmp_path}


def listing(tree: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``tree`` with its size and mtime (to see that nothing wrote there)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), tree)] = (st.st_size, st.st_mtime_ns)
    return out


async def test_two_instances_share_one_base(world, repo):
    p = world["provider"]()
    t1, t2 = instance(repo, "c1", "i1"), instance(repo, "c2", "i2")
    id1, id2 = await p.identity(t1), await p.identity(t2)
    assert id1.base.key == id2.base.key and id1.key != id2.key
    await asyncio.gather(p.view_for(t1), p.view_for(t2))
    assert sorted(p.built) == sorted([id1.base.key, id1.key, id2.key])  # the base once, an instance each
    assert p.store.record(id1.key).deleted == [".venv/stale.txt"]
    base_tree = p.store.tree(id1.base.key)
    base = p.store.record(id1.base.key)
    assert base.kind == "base" and base.paths == [".venv/"]
    assert sorted(os.listdir(base_tree)) == [".venv"]  # no .git, no tracked file of the setup commit
    assert (base_tree / ".venv" / "built-at").read_text().strip() == repo["c3"]  # built at environment_setup_commit
    before = listing(base_tree)
    for t, commit, version, n in ((t1, "c1", "1", 1), (t2, "c2", "2", 2)):
        spec = await p.runtime.sandbox_spec(t, SandboxSpec(labels={"run_id": "layers"}))
        assert [layer.path for layer in spec.view.layers] == [str(p.store.tree(spec.view.key)), str(base_tree)]
        sb = await create_sandbox(world["sb"], spec)
        try:
            ws = await prepare_workspace(sb, t, p.runtime)
            assert ws.base_commit == repo[commit] and ws.setup.ok and len(ws.setup.steps) == len(BASE_SETUP + SETUP)
            r = await sb.exec("git log --format=%s; git status --porcelain; ls -a .venv", cwd=ws.workdir)
            out = r.stdout.split()
            assert out[:n + 1] == [*(f"c{i}" for i in range(n, 0, -1)), "."], r  # its history; a clean status
            assert "built-at" in out and "stale.txt" not in out  # the base's venv, less what the instance deleted
            r = await sb.exec(".venv/bin/python -c 'import pkg; print(pkg.VERSION)'", cwd=ws.workdir)
            assert r.ok and r.stdout.strip() == version, r  # the venv imports this instance's checkout
            r = await sb.exec(f"git cat-file -e {repo['c3']}", cwd=ws.workdir)
            assert r.exit_code != 0  # no later history
            r = await sb.exec("echo mine > pkg/new.py && echo x >> .venv/built-at", cwd=ws.workdir)
            assert r.ok
            assert (sb.dir / "view" / "upper" / "pkg" / "new.py").read_text() == "mine\n"  # the rollout's upper
            assert not (p.store.tree(spec.view.key) / "pkg" / "new.py").exists()
        finally:
            await sb.close()
    assert listing(base_tree) == before  # never written, by builds or rollouts
    assert not mounts_under(world["tmp"] / "sb")
