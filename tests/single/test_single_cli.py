"""`farm rollout` as a user runs it: default config (demo tasks, oracle engine, local
sandboxes, Claude Code), a fresh working directory, a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from single_helpers import stored_ids

pytestmark = pytest.mark.slow


def farm(tmp_path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-m", "farm", "rollout", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_farm_rollout_json_on_the_default_config(tmp_path):
    proc = farm(tmp_path, "--task", "demo-wordfreq", "--harness", "claude_code", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and out["reward"] == 1.0, out
    assert out["turns"] >= 2 and out["tokens"]["output"] > 0 and out["duration_s"] > 0
    progress = [line for line in proc.stderr.splitlines() if line.startswith("demo-wordfreq.0 turn ")]
    assert len(progress) == out["turns"]  # one progress line per turn
    assert out["outputs"]["output_dir"] == str(tmp_path / "runs" / "local")
    assert stored_ids(tmp_path / "runs" / "local") == ({"demo-wordfreq.0"}, {"demo-wordfreq.0"})


def test_farm_rollout_bad_arguments_fail_before_starting_anything(tmp_path):
    proc = farm(tmp_path, "--task", "nope", "--json", timeout=120)
    assert proc.returncode == 2 and "unknown task 'nope'" in proc.stderr and proc.stdout == ""
    from farm.config import FarmConfig

    proc = farm(tmp_path, "--task", "demo-wordfreq", "--endpoint", "hosted", timeout=120)
    if "endpoint" in FarmConfig.model_fields:  # the endpoint catalog (issue 15 section 2) is there
        assert "hosted" in proc.stderr and proc.returncode == 2
    else:
        assert proc.returncode == 2 and "--endpoint needs a config with named endpoints" in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written
