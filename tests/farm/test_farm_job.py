"""`ray job submit -- farm run CONFIG` against a `ray start --head` cluster started (and
stopped) by the test, with Ray 2.60's default token auth: a job stopped mid-run, then the
same job submitted again (one job run to the end serves both checks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from farm.output.writer import ROLLOUTS_TABLE
from farm.output.shard_reader import ShardReader

from farm_raycluster import start_head

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def head():
    cluster = start_head(num_cpus=2)
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)  # its session logs and sockets
    assert not cluster.processes()


def _metrics(cluster) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=10) as resp:
        return resp.read().decode()


@pytest.mark.timeout(900)
def test_ray_job_stop_then_resubmit_records_every_rollout_once(head, tmp_path):
    """`ray job stop` sends SIGTERM to `farm run`: in-flight rollouts are interrupted
    (recorded nowhere), the job ends STOPPED; resubmitting runs exactly what is missing.
    The resubmission is the plain `ray job submit -- farm run` a user runs (it waits for the
    job): it succeeds, its progress reaches the job log, the farm's series reach Ray's
    Prometheus endpoint and nothing of the job is left alive."""
    work = tmp_path / "job"
    work.mkdir()
    out = tmp_path / "out"
    cfg = {
        "run_id": "jobstop",
        "tasks": {"path": "demo"},
        "harness": {"name": "claude_code"},
        "engine": {"mode": "simulator", "policy": "oracle", "simulator": {"latency": {"ttft_s": 2.0}}},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb")}},
        "rollout": {"limit": 3, "concurrency": 2, "timeout_s": 600},
        "ray": {"reducer_flush_s": 0.2, "num_sandbox_actors": 1, "drain_timeout_s": 60},
        "output": {"dir": str(out)},
    }
    (work / "job.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    ray_cmd = [str(BIN / "ray"), "job"]

    def submit(job_id: str, *, wait: bool) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*ray_cmd, "submit", "--address", head.dashboard_url, "--working-dir", str(work), "--submission-id",
             job_id, *([] if wait else ["--no-wait"]), "--", str(BIN / "farm"), "run", "job.yaml"],
            capture_output=True, text=True, env=env, timeout=600)  # fmt: skip

    def status(job_id: str) -> str:
        res = subprocess.run([*ray_cmd, "status", "--address", head.dashboard_url, job_id],
                             capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        return res.stdout + res.stderr

    def wait_final(job_id: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = status(job_id).lower()  # "... STOPPED" or "Job 'x' was stopped", by version
            for final in ("succeeded", "stopped", "failed"):
                if final in text:
                    return final.upper()
            time.sleep(2)  # poll: the loop's deadline bounds the wait
        raise AssertionError(f"job {job_id} did not end: {status(job_id)}")

    assert submit("farm-stop-1", wait=False).returncode == 0
    deadline = time.monotonic() + 180
    while len(list((tmp_path / "sb" / "jobstop").glob("*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)  # poll: the loop's deadline bounds the wait
    time.sleep(3)  # the rollouts run a while: the stop lands mid-rollout
    stop = subprocess.run([*ray_cmd, "stop", "--address", head.dashboard_url, "farm-stop-1"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert wait_final("farm-stop-1", 300) == "STOPPED", stop.stdout + stop.stderr
    time.sleep(2)  # a window: a late write of the stopped run would land in it
    reader = ShardReader(out, name=ROLLOUTS_TABLE)
    first = reader.read_table().to_pylist() if reader.entries() else []
    assert all(r["status"] == "completed" for r in first), first  # nothing the stop caused is on record
    # The slow first token only kept the first job's rollouts in flight for the stop: the
    # resubmission (the same run, tasks and output; farm resumes across engine settings) gets
    # a prompt engine, which spares its 2-3 rollouts ~8 s of waiting each.
    cfg["engine"]["simulator"]["latency"]["ttft_s"] = 0.0
    (work / "job.yaml").write_text(yaml.safe_dump(cfg))
    res = submit("farm-stop-2", wait=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "succeeded" in res.stdout + res.stderr
    assert wait_final("farm-stop-2", 60) == "SUCCEEDED", status("farm-stop-2")
    missing = 3 - len(first)
    assert f"[{missing}/{missing}]" in res.stdout  # the driver's progress lines reach the job log
    rows = ShardReader(out, name=ROLLOUTS_TABLE).read_table().to_pylist()
    ids = sorted(r["rollout_id"] for r in rows)
    assert ids == sorted(set(ids)) and len(ids) == 3, ids
    assert all(r["status"] == "completed" and r["reward"] == 1.0 for r in rows), rows
    samples = ShardReader(out).read_table().column("rollout_id").to_pylist()
    assert sorted(set(samples)) == ids  # Samples of every rollout, of no interrupted attempt
    summary = json.loads((out / "summary.json").read_text())
    assert summary["by_status"] == {"completed": missing} and summary["skipped_done"] == len(first), summary
    _check_metrics(head)
    # Nothing of either job is left alive on the cluster.
    listed = subprocess.run(
        [*ray_cmd[:1], "list", "actors", "--address", head.address, "--filter", "state=ALIVE", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    alive = [] if "No resource" in listed.stdout else json.loads(listed.stdout)
    assert not [a for a in alive if (a.get("name") or "").startswith("farm-jobstop-")]
    assert not [p for p in (tmp_path / "sb" / "jobstop").glob("*/*")]


def _check_metrics(cluster) -> None:
    """The farm's series reach Ray's Prometheus endpoint (exported asynchronously)."""
    deadline = time.monotonic() + 60
    text = _metrics(cluster)
    while time.monotonic() < deadline and "ray_farm_rollouts" not in text:
        time.sleep(2)  # only while the series is not there yet
        text = _metrics(cluster)
    assert "ray_farm_rollouts" in text and 'status="completed"' in text, text[-2000:]
    # every documented series is really emitted (the latencies from the turns' recorded timings)
    for series in ("ray_farm_engine_latency_s_count", "ray_farm_gateway_latency_s_count", "ray_farm_turns",
                   "ray_farm_tokens", "ray_farm_rollouts_by_class", "ray_farm_rollout_seconds_sum",
                   "ray_farm_sandbox_create_s_count", "ray_farm_shards_written"):
        deadline = time.monotonic() + 30
        while series not in text and time.monotonic() < deadline:
            time.sleep(2)  # poll: the loop's deadline bounds the wait
            text = _metrics(cluster)
        assert series in text, (series, text[-3000:])
    assert 'class="policy"' in text
