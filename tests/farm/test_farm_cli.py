"""`farm run` as a user runs it (a subprocess starting its own Ray): Ctrl-C stops it
cleanly; a second invocation of a running run fails fast; a SIGKILLed driver resumes on
rerun, writing only the missing rollouts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from farm.output.writer import ROLLOUTS_TABLE, SAMPLES_TABLE
from farm.output.shard_reader import ShardReader

from farm_raycluster import HeadCluster

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]
FARM = str(Path(sys.executable).parent / "farm")


def _config(tmp_path: Path, run_id: str, *, limit: int, concurrency: int, ttft: float = 0.0) -> Path:
    cfg = {
        "run_id": run_id,
        "tasks": {"path": "demo"},
        "harness": {"name": "claude_code"},
        "engine": {"mode": "simulator", "policy": "oracle", "simulator": {"latency": {"ttft_s": ttft}}},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb")}},
        "rollout": {"limit": limit, "concurrency": concurrency, "timeout_s": 600},
        "ray": {"num_sandbox_actors": 1, "reducer_flush_s": 0.2, "num_cpus": 2, "include_dashboard": False,
                "drain_timeout_s": 60},
        "output": {"dir": str(tmp_path / "out")},
    }  # fmt: skip
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class FarmProcess:
    """`farm run` in its own session, with its own Ray temp dir (so we can find its processes)."""

    def __init__(self, cfg: Path) -> None:
        self.ray_tmp = tempfile.mkdtemp(prefix="frd")  # short: unix socket paths are limited
        env = {**os.environ, "RAY_TMPDIR": self.ray_tmp}
        env.pop("RAY_ADDRESS", None)
        self.log = open(cfg.parent / f"farm-{time.monotonic_ns()}.log", "w+")
        self.proc = subprocess.Popen([FARM, "run", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)  # fmt: skip

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def ray_processes(self) -> list[int]:
        return HeadCluster(self.ray_tmp, 0, 0, 0).processes()

    def wait_gone(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.ray_processes() and time.monotonic() < deadline:
            time.sleep(0.5)  # poll: the loop's deadline bounds the wait
        left = [(pid, Path(f"/proc/{pid}/cmdline").read_bytes()[:150]) for pid in self.ray_processes()]
        HeadCluster(self.ray_tmp, 0, 0, 0).stop()
        shutil.rmtree(self.ray_tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {left}"


def _wait_for(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # poll: the loop's deadline bounds the wait


def _ids(out: Path, table: str) -> list[str]:
    reader = ShardReader(out, name=table)
    return reader.read_table().column("rollout_id").to_pylist() if reader.entries() else []


def _sandboxes_left(tmp_path: Path, run_id: str) -> list[Path]:
    base = tmp_path / "sb" / run_id
    return [p for p in base.iterdir() if any(p.iterdir())] if base.exists() else []


def _bwrap_of(tmp_path: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "bwrap" in line and str(tmp_path / "sb") in line]


def test_ctrl_c_cancels_in_flight_and_leaves_nothing(tmp_path):
    farm = FarmProcess(_config(tmp_path, "ctrlc", limit=2, concurrency=2, ttft=2.0))
    try:
        _wait_for(lambda: len(list((tmp_path / "sb" / "ctrlc").glob("*"))) >= 2, 300, "two sandboxes")
        time.sleep(2)  # the rollouts run a while: the Ctrl-C lands mid-rollout
        os.killpg(farm.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        assert farm.proc.wait(timeout=120) == 130, farm.output()
    finally:
        if farm.proc.poll() is None:
            os.killpg(farm.proc.pid, signal.SIGKILL)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["by_status"].get("interrupted", 0) >= 1, summary
    assert not _sandboxes_left(tmp_path, "ctrlc")
    assert not _bwrap_of(tmp_path)
    assert set(_ids(tmp_path / "out", ROLLOUTS_TABLE)) <= {"demo-romans.0", "demo-intervals.0"}
    farm.wait_gone()


def _rows(out: Path) -> list[dict]:
    reader = ShardReader(out, name=ROLLOUTS_TABLE)
    return reader.read_table().to_pylist() if reader.entries() else []


@pytest.mark.timeout(900)  # a stopped run, its rerun and a refused invocation: over the default 300 s on a loaded machine
@pytest.mark.parametrize("signals", [("SIGINT", "SIGINT")], ids=["sigint_twice"])  # SIGTERM: test_farm_job, bench_faults
def test_a_stop_records_nothing_poisoned_and_the_rerun_runs_exactly_the_interrupted(tmp_path, signals):
    """`ray job stop` sends SIGTERM; a second Ctrl-C forces the stop. Either way the
    in-flight rollouts are interrupted (not recorded, no Samples), the exit code is 130,
    and rerunning the same command runs exactly those again. A second invocation while
    the rerun owns the run fails fast and harms nothing (its own farm run would cost a
    whole run: the rerun is one)."""
    cfg = _config(tmp_path, "stop", limit=3, concurrency=2, ttft=2.0)
    farm = FarmProcess(cfg)
    try:
        _wait_for(lambda: farm.proc.poll() is not None or len(list((tmp_path / "sb" / "stop").glob("*"))) >= 2,
                  300, "two sandboxes")  # fmt: skip
        assert farm.proc.poll() is None, farm.output()
        time.sleep(3)  # the rollouts run a while: the stop lands mid-rollout
        for name in signals:
            os.kill(farm.proc.pid, getattr(signal, name))
            time.sleep(1.0)  # the second signal a moment after the first, as a user presses twice
        assert farm.proc.wait(timeout=180) == 130, farm.output()
    finally:
        if farm.proc.poll() is None:
            os.killpg(farm.proc.pid, signal.SIGKILL)
    farm.wait_gone()
    out = tmp_path / "out"
    first = _rows(out)
    # nothing the stop caused is on record: only rollouts that really finished
    assert all(r["status"] == "completed" for r in first), [(r["rollout_id"], r["status"], r["reason"]) for r in first]
    assert sorted(_ids(out, SAMPLES_TABLE)) == sorted(r["rollout_id"] for r in first)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["by_status"].get("interrupted", 0) >= 1, summary
    assert not _sandboxes_left(tmp_path, "stop") and not _bwrap_of(tmp_path)
    # The slow first token only kept the first run's rollouts in flight for the stop: the
    # rerun (the same run, tasks and output; farm resumes across engine settings) gets a
    # prompt engine, which spares its rollouts ~8 s of waiting each. It still owns the run
    # for a rollout's length after its first sandbox: the refused invocation takes ~2 s.
    cfg = _config(tmp_path, "stop", limit=3, concurrency=2)
    rerun = FarmProcess(cfg)
    try:
        # While the rerun owns the run (a rollout in flight), a second invocation of the same
        # command fails fast, naming the owner, and harms nothing: the rerun still records
        # every rollout exactly once (below).
        _wait_for(lambda: rerun.proc.poll() is not None or len(list((tmp_path / "sb" / "stop").glob("*"))) >= 1,
                  300, "a sandbox of the rerun")  # fmt: skip
        assert rerun.proc.poll() is None, rerun.output()
        second = subprocess.run([FARM, "run", str(cfg)], capture_output=True, text=True, timeout=120,
                                env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert "run 'stop' is already running" in second.stderr and f"pid {rerun.proc.pid}" in second.stderr
        assert rerun.proc.wait(timeout=400) == 0, rerun.output()
    finally:
        if rerun.proc.poll() is None:
            os.killpg(rerun.proc.pid, signal.SIGKILL)
    rerun.wait_gone()
    rows = _rows(out)
    ids = [r["rollout_id"] for r in rows]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 3, ids
    assert all(r["status"] == "completed" and r["reward"] == 1.0 for r in rows), rows
    again = json.loads((out / "summary.json").read_text())
    assert again["planned"] == 3 - len(first) and again["skipped_done"] == len(first), again


def test_killed_driver_rerun_writes_only_the_missing_rollouts(tmp_path):
    cfg = _config(tmp_path, "kdrv", limit=2, concurrency=1)
    farm = FarmProcess(cfg)
    try:
        _wait_for(lambda: len(_ids(tmp_path / "out", ROLLOUTS_TABLE)) >= 1, 180, "a durable rollout")
        farm.proc.send_signal(signal.SIGKILL)
        farm.proc.wait(timeout=30)
    finally:
        if farm.proc.poll() is None:
            farm.proc.kill()
    farm.wait_gone()
    # Durable = its row, or its Samples (a kill between the two commits: the rerun's
    # reducer rebuilds the row from the Samples).
    done = set(_ids(tmp_path / "out", ROLLOUTS_TABLE)) | set(_ids(tmp_path / "out", SAMPLES_TABLE))
    assert 1 <= len(done) < 2, done
    rerun = FarmProcess(cfg)
    assert rerun.proc.wait(timeout=300) == 0, rerun.output()
    rerun.wait_gone()
    assert f"resuming: {len(done)} rollouts already" in rerun.output()
    rows = _ids(tmp_path / "out", ROLLOUTS_TABLE)
    assert sorted(rows) == sorted(set(rows)) and len(rows) == 2
    assert sorted(_ids(tmp_path / "out", SAMPLES_TABLE)) == sorted(rows)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert (summary["planned"], summary["skipped_done"]) == (2 - len(done), len(done))
    assert not _sandboxes_left(tmp_path, "kdrv") and not _bwrap_of(tmp_path)
