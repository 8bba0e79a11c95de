"""examples/train_loop.py as a user runs it, started by ``scripts/bench_learning.py --quick``
(the benchmark at its smallest size: one run checks both): farm's tiny CPU model behind the
scripted workers (real Ray, real Claude Code CLI, the real router), the choose-one-of-K-fixes
family where the model's sampled choice decides the reward, GRPO on farm's groups in
continuous mode, weights pushed back every step. The loop's last line is the contract: within
the staleness bound, and the engine's logprobs of every trained token agree with the
trainer's recomputation (train_rollout_logprob_diff); the benchmark's last line has the
figures its docstring promises."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from bench_lines import assert_last_line

pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]

ROOT = Path(__file__).resolve().parents[2]


def test_train_loop_runs_within_its_staleness_bound_and_logprobs_agree(tmp_path):
    cfg = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    cfg["sandbox"] = {"backend": "local", "local": {"base_dir": str(tmp_path / "sb")}}
    cfg["ray"] = {"num_sandbox_actors": 1, "reducer_flush_s": 0.2, "num_cpus": 2, "include_dashboard": False}
    cfg["rollout"].update(concurrency=2, timeout_s=600)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ray_tmp = tempfile.mkdtemp(prefix="frt")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out"
    try:
        # bench_learning --quick runs: train_loop.py --choice 4 --steps 2 --groups 1 --n 2 (staleness 1, drop)
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench_learning.py"), "--quick", "--config", str(path),
             "--out", str(out)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)  # its Ray's session logs and sockets
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_last_line(lines[-1], ROOT / "scripts" / "bench_learning.py")
    loop = next(ln for ln in reversed(lines) if ln.startswith("train_loop:"))
    m = re.fullmatch(r"train_loop: steps=(\d+) groups=(\d+) max_staleness=(\d+) stale_dropped=(\d+) "
                     r"stale_aborted=(\d+) version_final=(\d+) bound=1 train_rollout_logprob_diff=(\S+) "
                     r"train_rollout_logprob_diff_mean=(\S+)", loop)
    assert m, loop
    steps, groups, max_stale, _, _, version = map(int, m.groups()[:6])
    assert steps == 2 and groups == 2 and max_stale <= 1 and version == 2
    assert float(m.group(7)) <= 1e-4 and float(m.group(8)) <= 1e-4
    step_lines = [json.loads(ln) for ln in lines if ln.startswith('{"step"')]
    assert len(step_lines) == 2 and all(s["trained_tokens"] > 0 for s in step_lines)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0", "step-1", "step-2"]
    # the model chose: each rollout applied one candidate (or none), and the grader decided
    rows = [json.loads(ln) for ln in (out / "tasks.jsonl").read_text().splitlines()]
    assert all(len(r["metadata"]["candidate_patches"]) == 4 for r in rows)
