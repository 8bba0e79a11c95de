"""Run a project's pytest with farm's grading probe loaded, outside any sandbox: for the
probe's own tests, or a user checking how farm's probe sees a task's test suite."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from farm.grading.probe import PLUGIN, Probe, ProbeReport, plugin_source, read_probe


def run_with_probe(project: Path, args: list[str], *, python: str = sys.executable, scratch: Path,
                   timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], ProbeReport]:  # fmt: skip
    """``python -m pytest -rA -p no:cacheprovider ARGS`` in ``project`` with the probe
    (written to a fresh directory under ``scratch``, as the grader does in a sandbox)."""
    directory = scratch / f".farm-probe-{secrets.token_hex(6)}"
    directory.mkdir(parents=True)
    key = secrets.token_bytes(32)
    (directory / f"{PLUGIN}.py").write_text(plugin_source())
    (directory / "key").write_bytes(key)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    env = Probe(directory=str(directory), key=key).env(base)
    res = subprocess.run([python, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args], cwd=project, env=env,
                         capture_output=True, text=True, timeout=timeout)  # fmt: skip
    report = directory / "report.jsonl"
    return res, read_probe(report.read_text() if report.exists() else None, key)
