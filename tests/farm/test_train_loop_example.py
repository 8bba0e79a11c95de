"""examples/train_loop.py as a user runs it: a tiny CPU model trained on farm's groups
in continuous mode (real Ray, real Claude Code CLI, the scripted engine behind the real
router), weights pushed back every step. Its last line is the contract."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_train_loop_runs_within_its_staleness_bound(tmp_path):
    cfg = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    cfg["sandbox"] = {"backend": "local", "local": {"base_dir": str(tmp_path / "sb")}}
    cfg["ray"] = {"num_sandbox_actors": 1, "reducer_flush_s": 0.2, "num_cpus": 2, "include_dashboard": False}
    cfg["rollout"].update(concurrency=2, timeout_s=600)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="frt")}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_loop.py"), "--config", str(path), "--out", str(out),
         "--steps", "2", "--groups", "1", "--n", "1", "--max-staleness", "1", "--on-stale", "drop"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = re.fullmatch(r"train_loop: steps=(\d+) groups=(\d+) max_staleness=(\d+) stale_dropped=(\d+) "
                     r"stale_aborted=(\d+) version_final=(\d+) bound=1", lines[-1])
    assert m, lines[-1]
    steps, groups, max_stale, _, _, version = map(int, m.groups())
    assert steps == 2 and groups == 2 and max_stale <= 1 and version == 2
    assert sum(1 for ln in lines if ln.startswith('{"step"')) == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1.pt", "step-2.pt"]
