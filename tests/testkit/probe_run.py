"""Run a project's pytest with farm's grading probe loaded, under farm's witness, outside
any sandbox: for the probe's own tests, or a user checking how farm's probe sees a task's
test suite."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from farm.grading.probe import FILES, Probe, ProbeReport, probe_config, read_probe
from farm.grading.witness import SCRIPT, Witness, inside_source


def install_probe(scratch: Path, project: Path, tests: list[str]) -> Probe:
    """The probe's files, its config (``tests``: the test files it fixes, relative to
    ``project``) and a key in a fresh directory under ``scratch``, as the grader writes them."""
    directory = scratch / f".farm-probe-{secrets.token_hex(6)}"
    directory.mkdir(parents=True)
    for name in (SCRIPT, *FILES):
        (directory / name).write_text(inside_source(name))
    config = probe_config(str(project), [f"{t}::x" for t in tests])
    (directory / "config.json").write_text(json.dumps(config))
    key = secrets.token_bytes(32)
    (directory / "key").write_bytes(key)
    return Probe(witness=Witness(directory=str(directory), key=key))


def run_probe(project: Path, args: list[str], *, python: str = sys.executable, scratch: Path, timeout: float = 300,
              tests: list[str] | None = None, env: Mapping[str, str] | None = None,
              ) -> tuple[subprocess.CompletedProcess[str], Probe]:  # fmt: skip
    """``python -m pytest -rA -p no:cacheprovider ARGS`` in ``project`` under the witness,
    with the probe fixing ``tests`` (default: the test files among ``args``): the run, and
    the probe (its report is at ``probe.report_path``, signed under ``probe.key``)."""
    tests = [a for a in args if a.endswith(".py") and "test" in os.path.basename(a)] if tests is None else tests
    probe = install_probe(scratch, project, tests)
    base = dict(env) if env is not None else {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHON"))}
    command = [python, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args]
    witness = [sys.executable, "-S", "-E", "-s", str(Path(probe.directory) / SCRIPT), probe.directory, "--", *command]
    res = subprocess.run(witness, cwd=project, env=probe.env(base), capture_output=True, encoding="utf-8",
                         errors="replace", timeout=timeout)  # fmt: skip
    return res, probe


def run_with_probe(project: Path, args: list[str], *, python: str = sys.executable, scratch: Path,
                   timeout: float = 300, tests: list[str] | None = None, env: Mapping[str, str] | None = None,
                   ) -> tuple[subprocess.CompletedProcess[str], ProbeReport]:  # fmt: skip
    """``run_probe``, and what farm reads of its report."""
    res, probe = run_probe(project, args, python=python, scratch=scratch, timeout=timeout, tests=tests, env=env)
    report = Path(probe.report_path)
    return res, read_probe(report.read_text() if report.exists() else None, probe.key)
