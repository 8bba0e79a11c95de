"""A task's interpreter by version (found on this machine, shown to its sandboxes, used by
uv in setup), and a real SWE-bench-format row validated through snapshots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.envs.config import EnvsConfig
from farm.envs.provider import EnvProvider
from farm.errors import TaskError
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.tasks.config import TasksConfig
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime, find_python
from farm.workspace.prepare import prepare_workspace

OTHER = "3.12" if not sys.version.startswith("3.12") else "3.11"


def test_find_python_by_version():
    exe = find_python(OTHER)
    out = subprocess.run([exe, "-c", "import sys; print(sys.version)"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith(OTHER)
    with pytest.raises(TaskError, match="no python 2.5"):
        find_python("2.5")


async def test_a_task_python_by_version_builds_its_venv_with_uv(tmp_path):
    """Setup makes a venv with uv from the task's interpreter (no download, no network
    needed); the snapshot's venv runs that interpreter in a later sandbox."""
    runtime = TaskRuntime.from_config(TasksConfig(cache_dir=str(tmp_path / "tc")))
    sb_cfg = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb"), setup_network="isolated"))
    envs = EnvProvider(EnvsConfig(cache_dir=str(tmp_path / "envs")), runtime, lambda s: create_sandbox(sb_cfg, s))
    runtime.envs = envs
    task = Task(id="py", instruction="x", python=OTHER, verify_commands=["true"],
                setup_commands=["uv venv -q .venv", "echo .venv/ >> .git/info/exclude"])  # fmt: skip
    spec = await runtime.sandbox_spec(task, SandboxSpec(labels={"run_id": "py"}))
    assert spec.ro_binds and spec.view is not None  # the interpreter's prefix, shown read-only
    sb = await create_sandbox(sb_cfg, spec)
    try:
        ws = await prepare_workspace(sb, task, runtime)
        r = await sb.exec(".venv/bin/python -c 'import sys; print(sys.version)'", cwd=ws.workdir)
        assert r.ok and r.stdout.startswith(OTHER), r
    finally:
        await sb.close()


def test_validate_tasks_on_a_real_swebench_row(tmp_path):
    """`farm validate-tasks` on a SWE-bench-format row (mirror + recipe): gold resolves,
    empty does not, and its environment was built once for both gradings."""
    from testkit.sdist_task import make_task_set

    row = make_task_set(tmp_path / "row")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run(
        [sys.executable, "-m", "farm", "validate-tasks", str(row["tasks"]), "--report", str(tmp_path / "r.json"),
         "--set", f"tasks.recipes={row['recipes']}", "--set", f"tasks.mirror_dir={row['mirrors']}",
         "--set", f"envs.cache_dir={tmp_path / 'envs'}", "--set", f"sandbox.local.base_dir={tmp_path / 'sb'}",
         "--set", f"tasks.cache_dir={tmp_path / 'tc'}"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["valid"] == 1
    (meta,) = [json.loads(p.read_text()) for p in (tmp_path / "envs").glob("*/meta.json")]
    assert meta["ok"] and meta["task_ids"] == ["pypi__inflection-1"]
