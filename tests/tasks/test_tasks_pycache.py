"""pytest's caches of a host interpreter's plugins, written before its first sandbox
(farm/tasks/pycache.py): a real venv with a real entry-point plugin, collected by a real
pytest; the runtime asks once an interpreter, and not when told not to."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from farm.sandboxes.base import SandboxSpec
from farm.tasks import pycache
from farm.tasks.config import TasksConfig
from farm.tasks.model import Task
from farm.tasks.pycache import warm_once, warm_pytest_plugins
from farm.tasks.runtime import TaskRuntime

PLUGIN = "farmwarm_plugin"


def _venv_with_plugin(root: Path) -> tuple[str, Path]:
    """A venv that sees this interpreter's packages (pytest) through a .pth, with a plugin of
    its own installed as pip installs one: a module, its dist-info, a pytest11 entry point."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    exe = str(root / "bin" / "python")
    purelib = Path(subprocess.run([exe, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    (purelib / "host.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (purelib / f"{PLUGIN}.py").write_text("def pytest_configure(config):\n    assert config is not None\n")
    info = purelib / f"{PLUGIN}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {PLUGIN}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[pytest11]\nfarmwarm = {PLUGIN}\n")
    (info / "RECORD").write_text(f"{PLUGIN}.py,,\n{PLUGIN}-0.1.dist-info/METADATA,,\n")
    return exe, purelib


def _rewritten(purelib: Path) -> list[Path]:
    return sorted((purelib / "__pycache__").glob(f"{PLUGIN}.*-pytest-*.pyc"))


def test_warming_writes_the_rewritten_cache_of_an_entry_point_plugin(tmp_path: Path, monkeypatch) -> None:
    exe, purelib = _venv_with_plugin(tmp_path / "venv")
    # what a farm process may carry, which would keep the cache unwritten or the plugin unloaded
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:farmwarm")
    assert _rewritten(purelib) == []
    assert asyncio.run(warm_pytest_plugins(exe)) is True
    cached = _rewritten(purelib)
    assert len(cached) == 1, sorted(p.name for p in (purelib / "__pycache__").iterdir())
    # the rewritten module, as pytest keys it: its source's mtime and size in the header
    source = (purelib / f"{PLUGIN}.py").stat()
    header = cached[0].read_bytes()[:16]
    assert int.from_bytes(header[8:12], "little") == int(source.st_mtime) & 0xFFFFFFFF
    assert int.from_bytes(header[12:16], "little") == source.st_size


def test_a_warming_that_cannot_run_says_so_and_raises_nothing(tmp_path: Path, caplog) -> None:
    assert asyncio.run(warm_pytest_plugins(str(tmp_path / "no-python"))) is False
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no such module: _pytest'\nexit 3\n")
    broken.chmod(0o755)
    assert asyncio.run(warm_pytest_plugins(str(broken))) is False
    assert "its collection exited 3: no such module: _pytest" in caplog.text


def _counting(monkeypatch) -> list[str]:
    calls: list[str] = []

    async def fake(exe: str, **_: object) -> bool:  # the collection itself is the test above's
        calls.append(exe)
        await asyncio.sleep(0.05)  # a run still going while the others ask
        return True

    monkeypatch.setattr(pycache, "warm_pytest_plugins", fake)
    monkeypatch.setattr(pycache, "_warmed", set())
    monkeypatch.setattr(pycache, "_warming", {})
    return calls


def test_one_warming_an_interpreter_whoever_asks(monkeypatch) -> None:
    calls = _counting(monkeypatch)

    async def main() -> None:
        await asyncio.gather(*(warm_once("/x/python") for _ in range(5)), warm_once("/y/python"))
        await warm_once("/x/python")

    asyncio.run(main())
    asyncio.run(warm_once("/x/python"))  # another loop, the same process: done already
    assert sorted(calls) == ["/x/python", "/y/python"]


@pytest.mark.parametrize(("python", "warm", "expected"), [
    ("auto", True, [sys.executable]),  # farm's own interpreter, shown read-only
    ("auto", False, []),  # tasks.warm_pytest_caches=false: the host's directories untouched
    ("/opt/venv/bin/python", True, []),  # a path inside the sandbox (an image's): not the host's
    ("none", True, []),
])  # fmt: skip
def test_the_runtime_warms_a_host_interpreter_before_its_sandboxes(monkeypatch, python, warm, expected) -> None:
    calls = _counting(monkeypatch)
    runtime = TaskRuntime(config=TasksConfig(python=python, warm_pytest_caches=warm), repos=None)
    task = Task(id="t", instruction="fix it", workspace={"type": "tarball", "path": "/nowhere.tar"})

    async def main() -> None:
        for _ in range(3):
            await runtime.sandbox_spec(task, SandboxSpec())

    asyncio.run(main())
    assert calls == expected
