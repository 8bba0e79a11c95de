"""scripts/bench_density.py runs at its smallest size (``--quick``), so a refactor that breaks
it fails the suite rather than the next measurement: one farm rollout and one bare rollout
of a demo task, real sandboxes and CLIs, and the last line's figures."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_lines import assert_last_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_density_quick_prints_its_figures(tmp_path: Path, tokenizer_dir: Path) -> None:
    cache = tmp_path / "tokenizers"  # the session's builtin tokenizer: the benchmark trains none
    cache.mkdir()
    (cache / "farm-test").symlink_to(tokenizer_dir, target_is_directory=True)
    res = subprocess.run([sys.executable, "scripts/bench_density.py", "--quick", "--cache-dir", str(cache)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200, env={**os.environ, "TMPDIR": str(tmp_path)})
    out = res.stdout.strip().splitlines()
    assert res.returncode == 0 and out, res.stderr[-3000:]
    fig = {k: float(v) for k, v in assert_last_line(out[-1], ROOT / "scripts" / "bench_density.py").items()}
    assert 0 < fig["in_flight"] <= 1.0 and 0 < fig["slot_utilization"] <= 1.0
    assert fig["farm_cpu_ms_per_turn"] > 0 and 0 < fig["farm_cpu_share"] < 1
    # farm's CPU split: the gateway's per turn, the rest once a rollout (one rollout here)
    assert 0 < fig["farm_turn_path_ms_per_turn"] < fig["farm_cpu_ms_per_turn"] and fig["farm_once_ms_per_rollout"] > 0
    assert fig["capacity_ratio"] > 0 or math.isnan(fig["capacity_ratio"])
    # each way, its one rollout completed: farm's graded, bare's resolved by the oracle
    assert re.search(r"^  statuses=\{'completed': 1\}$", res.stdout, re.M), res.stdout[-3000:]
    bare = next(line for line in out if line.startswith("bench_density[bare n=1]:"))
    assert " rollouts=1 " in bare and " resolved=1 " in bare, bare
    # the node's CPU by owner: the CLI, its tools, the test command, farm's process, all counted
    owners = next(line for line in out if line.startswith("  cpu_s_per_rollout=") and "agent.cli" in line)
    for owner in ("agent.cli", "agent.tools", "agent.jail", "grading.test", "farm.process", "engine"):
        assert f"'{owner}': " in owners, owners
