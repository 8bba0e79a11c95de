"""The fault suite's quick version in CI: engine 5xx, a crashed CLI and a policy that
never stops (only the turn budget ends it), each followed by a resume of the same
command, through `farm run` with the real Claude Code CLI (a killed sandbox actor:
test_farm_kill_real.py; SIGTERM of the job: test_farm_job.py). Nothing lost, doubled, poisoned or leaked; the endless policy's
rollouts are truncated at their first attempt, the CLI ending cleanly. (Codex and
OpenCode at the budget: tests/harnesses/test_harnesses_e2e.py and the full bench.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]
BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench_faults.py"


@pytest.mark.timeout(1200)
def test_quick_fault_suite_loses_doubles_poisons_and_leaks_nothing():
    # the three scenarios side by side: each its own `farm run`, Ray, sandbox dir and output
    res = subprocess.run([sys.executable, str(BENCH), "--quick", "--tasks", "2", "--parallel", "3"],
                         capture_output=True, text=True, timeout=1150)  # fmt: skip
    out = res.stdout
    assert res.returncode == 0, res.stderr[-3000:]
    last = out.strip().splitlines()[-1]
    assert last == "bench_faults: scenarios=3 lost=0 duplicated=0 poisoned=0 leaked=0 truncated=2 unclean_stops=0", out
    lines = [ln for ln in out.splitlines() if ln.startswith("fault=")]
    assert len(lines) == 3
    for line in lines:
        figures = dict(kv.split("=", 1) for kv in line.split())
        assert figures["planned"] == figures["ended_once"] == "2" and figures["resume_exit"] == "0", line
    # the fault really happened: the CLI was killed (engine 5xx are mostly absorbed by the
    # router's and the CLI's own retries: that they poison nothing is what is checked there)
    by = {dict(kv.split("=", 1) for kv in ln.split())["fault"]: ln for ln in lines}
    assert "injected=0" not in by["cli_crash"], by["cli_crash"]
    # the budget ended each endless rollout as the policy's outcome: recorded once, never retried, Samples marked
    never = dict(kv.split("=", 1) for kv in by["never_stops"].split())
    assert never["first_run"] == "truncated:2;retried:0" and never["truncated_samples"] == "2", by["never_stops"]
