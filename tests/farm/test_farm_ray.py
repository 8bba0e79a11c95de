"""The farm on a real (local) Ray: driver + sandbox actors + reducer, with FakeParts
(real LocalSandboxes and processes; no CLI/engine: those are in the end-to-end tests).

Kill a sandbox actor mid-run, kill the reducer mid-run: every rollout still ends
exactly once, nothing lost, nothing duplicated, nothing left behind.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import ray
from rich.console import Console

import farm_helpers
from logger_helpers import mlflow_run, wandb_run
from farm.config import FarmConfig
from farm.actors.ray_cluster import actor_name
from farm.run.batch import run_batch
from farm.output.artifacts import read_index, read_text
from farm.output.groups import complete_groups
from farm.output.writer import ROLLOUTS_TABLE, SAMPLES_TABLE
from farm.tasks.model import Task
from farm.output.shard_reader import ShardReader

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    """The session's shared local Ray (tests/conftest.py)."""
    ray.cloudpickle.register_pickle_by_value(farm_helpers)


def _cfg(tmp_path: Path, run_id: str, **rollout) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": run_id,
        "sandbox": {"local": {"base_dir": str(tmp_path / "sandboxes")}},
        "rollout": {"concurrency": 2, "timeout_s": 120, **rollout},
        "ray": {"num_sandbox_actors": 2, "reducer_flush_s": 0.2, "actor_max_restarts": 3},
        "output": {"dir": str(tmp_path / "out")},
    })


def _tasks(tmp_path: Path, n: int, **md) -> list[Task]:
    return [Task(id=f"task{i}", instruction=f"do {i}",
                 metadata={"log_dir": str(tmp_path), "reward": float(i % 2), **md}) for i in range(n)]


def _ids(out: Path, table: str) -> list[str]:
    reader = ShardReader(out, name=table)
    return reader.read_table().column("rollout_id").to_pylist() if reader.entries() else []


def _started(tmp_path: Path) -> list[str]:
    p = tmp_path / "started"
    return p.read_text().split("\n") if p.exists() else []


def _assert_nothing_left(tmp_path: Path, run_id: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
        if not [n for n in names if n.startswith(f"farm-{run_id}-")]:
            break
        time.sleep(0.2)  # poll: the loop's deadline bounds the wait
    else:
        raise AssertionError(f"actors left: {names}")
    base = tmp_path / "sandboxes" / run_id
    # (an empty dir of a sandbox killed while being created may remain: reap skips unlabelled dirs)
    left = [p for p in base.iterdir() if any(p.iterdir())] if base.exists() else []
    assert not left, left
    from farm.sandboxes.local import sandbox_pids

    assert not [d.name for d in base.iterdir() if sandbox_pids(d.name)] if base.exists() else True


def _run(cfg, tasks, **kw):
    return run_batch(cfg, tasks=tasks, parts_factory=farm_helpers.FakeParts, console=Console(quiet=True), **kw)


def test_run_writes_both_tables_then_resumes_nothing(tmp_path):
    cfg = _cfg(tmp_path, "ok", n_samples=2)
    tasks = _tasks(tmp_path, 3)
    summary = _run(cfg, tasks)
    assert summary.by_status == {"completed": 6} and summary.resolved == 2 and summary.planned == 6
    out = tmp_path / "out"
    assert sorted(_ids(out, "rollouts")) == sorted(f"task{i}.{k}" for i in range(3) for k in range(2))
    assert sorted(_ids(out, "samples")) == sorted(_ids(out, "rollouts"))
    rows = ShardReader(out, name="rollouts").read_table().to_pylist()
    assert {r["group_id"] for r in rows} == {"task0", "task1", "task2"}
    assert all(r["reward"] == float(r["task_id"][-1]) % 2 for r in rows)
    assert {r["actor"] for r in rows} <= {actor_name("ok", "sandbox-0"), actor_name("ok", "sandbox-1")}
    assert json.loads((out / "summary.json").read_text())["by_status"] == {"completed": 6}
    _assert_nothing_left(tmp_path, "ok")
    again = _run(cfg, tasks)
    assert (again.planned, again.skipped_done, again.finished) == (0, 6, 0)
    more = _run(cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"n_samples": 3})}), tasks)
    assert (more.planned, more.skipped_done) == (3, 6)
    assert len(_ids(out, "rollouts")) == 9 == len(set(_ids(out, "rollouts")))


def _kill_when(tmp_path: Path, n_started: int, kill) -> threading.Thread:
    def watch():
        deadline = time.monotonic() + 60
        while len([s for s in _started(tmp_path) if s]) < n_started and time.monotonic() < deadline:
            time.sleep(0.05)  # poll: the loop's deadline bounds the wait
        time.sleep(0.3)  # the kill lands a moment after the start, mid-rollout
        kill()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_killed_sandbox_actor_every_rollout_ends_exactly_once(tmp_path):
    cfg = _cfg(tmp_path, "killsb")
    tasks = _tasks(tmp_path, 6, agent_s=1.5)
    victim = actor_name("killsb", "sandbox-0")
    t = _kill_when(tmp_path, 2, lambda: ray.kill(ray.get_actor(victim, namespace="farm"), no_restart=False))
    summary = _run(cfg, tasks)
    t.join()
    rows = _ids(tmp_path / "out", "rollouts")
    assert sorted(rows) == sorted(f"task{i}.0" for i in range(6)), rows
    assert summary.by_status == {"completed": 6} and summary.redispatched >= 1
    assert sorted(_ids(tmp_path / "out", "samples")) == sorted(rows)
    attempts = [s.split() for s in _started(tmp_path) if s]
    assert any(a == "2" for _, a in attempts)  # re-dispatched as attempt 2
    _assert_nothing_left(tmp_path, "killsb")


def test_killed_reducer_loses_and_duplicates_nothing(tmp_path):
    cfg = _cfg(tmp_path, "killred")
    tasks = _tasks(tmp_path, 8, agent_s=0.5)
    red = actor_name("killred", "reducer")
    t = _kill_when(tmp_path, 4, lambda: ray.kill(ray.get_actor(red, namespace="farm"), no_restart=False))
    summary = _run(cfg, tasks)
    t.join()
    rows = _ids(tmp_path / "out", "rollouts")
    assert sorted(rows) == sorted(f"task{i}.0" for i in range(8)), rows
    assert sorted(_ids(tmp_path / "out", "samples")) == sorted(rows)
    assert summary.finished == 8
    _assert_nothing_left(tmp_path, "killred")


def test_rollout_that_kills_its_actor_gives_up_after_max_attempts(tmp_path):
    cfg = _cfg(tmp_path, "crash", max_attempts=2, concurrency=1, retry_backoff_s=0.1)  # no other rollout shares a crash
    # three actor deaths in one run, and each probe that finds an actor still restarting counts as one
    # more: room enough that no actor leaves the pool (the rollouts would then end "no sandbox actor left")
    cfg.ray.actor_max_restarts = 8
    # "worse" kills its actor once, then fails for infrastructure every time: the death does not
    # spend an infrastructure retry (each kind has its own budget: farm.rollout.retry)
    worse = {"log_dir": str(tmp_path), "crash_actor": True, "crash_actor_attempts": 1, "infra_fail_attempts": 99}
    tasks = _tasks(tmp_path, 3) + [Task(id="bad", instruction="crash", metadata={"crash_actor": True}),
                                   Task(id="worse", instruction="crash once, then fail", metadata=worse)]
    summary = _run(cfg, tasks)
    rows = {r["rollout_id"]: r for r in ShardReader(tmp_path / "out", name="rollouts").read_table().to_pylist()}
    assert sorted(rows) == ["bad.0", "task0.0", "task1.0", "task2.0", "worse.0"]
    assert rows["bad.0"]["status"] == "sandbox_error" and "died 2 time(s)" in rows["bad.0"]["reason"], rows["bad.0"]
    assert rows["bad.0"]["attempt"] == 2
    worse = rows["worse.0"]
    assert "injected sandbox failure (attempt 4)" in worse["reason"], worse  # 1 + 1 death + 2 infrastructure retries
    assert worse["status"] == "sandbox_error" and worse["attempt"] == 4
    assert summary.by_status == {"completed": 3, "sandbox_error": 2} and summary.redispatched == 2
    assert summary.retried == 2
    _assert_nothing_left(tmp_path, "crash")


def test_infrastructure_failures_are_retried_then_recorded_untrainable(tmp_path):
    """A sandbox failure is infrastructure: retried with backoff; one that keeps failing is
    recorded with its reason after the last attempt and has no Sample anywhere."""
    cfg = _cfg(tmp_path, "infra", infra_retries=2, retry_backoff_s=0.1)
    flaky = Task(id="flaky", instruction="x", metadata={"log_dir": str(tmp_path), "infra_fail_attempts": 1})
    broken = Task(id="broken", instruction="x", metadata={"log_dir": str(tmp_path), "infra_fail_attempts": 99})
    fine = Task(id="fine", instruction="x", metadata={"log_dir": str(tmp_path)})
    summary = _run(cfg, [flaky, broken, fine])
    rows = {r["rollout_id"]: r for r in ShardReader(tmp_path / "out", name=ROLLOUTS_TABLE).read_table().to_pylist()}
    assert (rows["flaky.0"]["status"], rows["flaky.0"]["attempt"]) == ("completed", 2)
    assert (rows["broken.0"]["status"], rows["broken.0"]["attempt"]) == ("sandbox_error", 3)
    assert "injected sandbox failure (attempt 3)" in rows["broken.0"]["reason"]
    assert sorted(_ids(tmp_path / "out", SAMPLES_TABLE)) == ["fine.0", "flaky.0"]  # nothing of broken
    assert summary.retried == 3
    assert summary.cumulative.by_class == {"infrastructure": 1, "policy": 2}
    assert summary.cumulative.resolved_rate == 1.0  # over policy outcomes only
    # broken's group lost its only rollout to infrastructure: incomplete, not padded with a zero
    assert (summary.cumulative.groups_complete, summary.cumulative.incomplete_groups) == (2, ["broken"])
    assert complete_groups(tmp_path / "out") == {"flaky", "fine"}
    started = [ln for ln in _started(tmp_path) if ln]
    assert sorted(started) == sorted(["flaky.0 1", "flaky.0 2", "broken.0 1", "broken.0 2", "broken.0 3", "fine.0 1"])
    # artifacts: only the recorded attempt's, sent through Ray; the infrastructure failure's traceback
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / "artifacts").iterdir()) == ["broken.0", "fine.0", "flaky.0"]
    assert (read_index(out, "broken.0")["attempt"], read_index(out, "flaky.0")["attempt"]) == (3, 2)
    error = read_text(out, "broken.0", "error.txt")
    assert "injected sandbox failure (attempt 3)" in error and "Traceback (most recent call last)" in error
    assert read_text(out, "flaky.0", "error.txt") is None and read_text(out, "flaky.0", "diff.patch") == "diff --git a/x b/x\n"


def test_run_loggers_receive_metrics_and_summary(tmp_path, monkeypatch):
    """W&B (offline: WANDB_MODE) and MLflow (a file store) configured: each gets the metrics
    as rollouts finish and the summary at the end, read back from what they wrote."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = (tmp_path / "mlruns").as_uri()
    cfg = _cfg(tmp_path, "logged").model_copy(update={"loggers": FarmConfig.model_validate({"loggers": [
        {"kind": "wandb", "project": "farm-test", "dir": str(tmp_path / "wb"), "interval_s": 0},
        {"kind": "mlflow", "tracking_uri": uri, "interval_s": 0}]}).loggers})  # fmt: skip
    summary = _run(cfg, _tasks(tmp_path, 2))
    assert summary.by_status == {"completed": 2} and summary.mean_reward == 0.5
    wb = wandb_run(tmp_path / "wb")
    assert wb["name"] == "logged" and wb["config"]["run_id"] == "logged"
    assert [h["rollouts/done"] for h in wb["history"] if "rollouts/done" in h] == [1, 2]
    assert wb["history"][-1]["status/completed"] == 2 and wb["history"][-1]["reward/mean"] == 0.5
    assert wb["summary"]["summary/finished"] == 2 and wb["summary"]["summary/by_status.completed"] == 2
    assert ["resolved", "1"] in wb["tables"]["summary_table"]["data"]
    ml = mlflow_run(uri)
    assert ml["status"] == "FINISHED" and ml["name"] == "logged"
    assert ml["history"]["rollouts/done"] == [(1, 1.0), (2, 2.0)] and ml["history"]["reward/mean"][-1] == (2, 0.5)
    assert ml["history"]["summary.mean_reward"] == [(2, 0.5)]
    assert ml["artifacts"]["summary.json"]["by_status"] == {"completed": 2}


def test_a_damaged_output_dir_is_repaired_on_resume_and_nothing_is_lost(tmp_path):
    """Three kinds of damage a crash or a bad disk leaves, at once: a manifest line torn by
    a crash (the shard is adopted, not deleted), a shard deleted and a shard with flipped
    bytes (their rollouts run again). Afterwards every rollout has its Samples exactly once."""
    from farm.cli import main as farm_main

    cfg = _cfg(tmp_path, "damage", concurrency=1)
    cfg = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"num_sandbox_actors": 1})})
    tasks = _tasks(tmp_path, 6, agent_s=0.4)
    assert _run(cfg, tasks).finished == 6
    out = tmp_path / "out"
    entries = ShardReader(out, name=SAMPLES_TABLE).entries()
    assert len(entries) >= 3, "one commit per rollout expected (concurrency 1, flush 0.2 s)"
    deleted, flipped, torn = entries[0], entries[1], entries[-1]
    (out / deleted.shard).unlink()
    data = bytearray((out / flipped.shard).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / flipped.shard).write_bytes(bytes(data))
    manifest = out / "manifest.jsonl"
    manifest.write_bytes(manifest.read_bytes()[:-40])
    with pytest.raises(Exception, match="damaged shard"):
        ShardReader(out, name=SAMPLES_TABLE).read_shard(flipped)  # readers catch it by default
    again = _run(cfg, tasks)
    rerun = set(deleted.rollout_ids) | set(flipped.rollout_ids)
    assert again.planned == len(rerun) and again.finished == len(rerun)
    text = " | ".join(again.recovery)
    assert "adopted 1 unlisted shard" in text and "quarantined 1" in text and "run again" in text, text
    samples, rows = _ids(out, SAMPLES_TABLE), _ids(out, ROLLOUTS_TABLE)
    assert sorted(samples) == sorted(rows) == sorted(f"task{i}.0" for i in range(6))  # each exactly once
    assert (out / "quarantine" / flipped.shard).is_file()
    assert farm_main(["verify", str(out)]) == 0
