"""farm.Farm on a real (local) Ray with FakeParts (real sandboxes and processes, no
CLI/engine; the engine side of weight updates is in tests/engine and the example's
test): back-pressure, groups out, stale rollouts aborted and run again, stop/resume."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import ray
from rich.console import Console

import farm_helpers
from farm.config import FarmConfig
from farm import Farm
from farm.output.writer import ROLLOUTS_TABLE
from farm.tasks.model import Task
from farm.output.shard_reader import ShardReader
from testkit.waits import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    """The session's shared local Ray (tests/conftest.py)."""
    ray.cloudpickle.register_pickle_by_value(farm_helpers)


def _cfg(tmp_path: Path, **stream) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": "cont",
        "sandbox": {"local": {"base_dir": str(tmp_path / "sandboxes")}},
        "rollout": {"concurrency": 4, "timeout_s": 120, "n_samples": 2},
        "ray": {"num_sandbox_actors": 1, "reducer_flush_s": 0.1},
        "output": {"dir": str(tmp_path / "out")},
        "stream": {"epochs": None, "max_ahead": 4, **stream},
    })


def _tasks(tmp_path: Path, agent_s: float, **md) -> list[Task]:
    return [Task(id=f"task{i}", instruction=f"do {i}",
                 metadata={"log_dir": str(tmp_path), "reward": float(i % 2), "agent_s": agent_s, **md})
            for i in range(3)]


def _started(tmp_path: Path) -> list[tuple[str, int]]:
    p = tmp_path / "started"
    lines = p.read_text().split("\n") if p.exists() else []
    return [(ln.split()[0], int(ln.split()[1])) for ln in lines if ln.strip()]


def _farm(tmp_path: Path, agent_s: float, md: dict | None = None, order: str = "completion", **stream) -> Farm:
    return Farm(_cfg(tmp_path, **stream), tasks=_tasks(tmp_path, agent_s, **(md or {})), order=order,
                parts_factory=farm_helpers.FakeParts,
                console=Console(file=io.StringIO()))


def test_groups_out_under_back_pressure_then_resume(tmp_path):
    with _farm(tmp_path, 0.2, order="task") as f:  # task order: the stream's, whatever finishes first
        wait_until(lambda: len(_started(tmp_path)) >= 4, timeout_s=90, what="4 rollouts started")
        time.sleep(3.0)  # nobody consumes: dispatch stops at stream.max_ahead rollouts (would overrun by now)
        assert len(_started(tmp_path)) == 4 and f.stats()["ahead"] == 4
        groups = f.next_groups(3, timeout=90)
        assert [g.complete for g in groups] == [True, True, True] and all(len(g.samples) == 2 for g in groups)
        assert [g.group_index for g in groups] == [0, 1, 2]
        assert {g.group_id for g in groups} == {"task0", "task1", "task2"}  # epoch 0 keeps the task ids
        assert [g.rewards for g in sorted(groups, key=lambda g: g.group_index)] == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
        more = f.next_groups(1, timeout=90)
        assert [g.group_id for g in more] == ["task0@1"]  # the second epoch
        assert f.stats()["ahead"] <= 4
    summary = f.summary
    assert summary is not None and (tmp_path / "out" / "summary.json").exists()
    first = set(ShardReader(tmp_path / "out", name=ROLLOUTS_TABLE).rollout_ids())
    # a new trainer on the same output: groups finished before it started are not handed out again
    with _farm(tmp_path, 0.2) as f2:
        again = f2.next_groups(2, timeout=90)
        assert len(again) == 2 and not {g.group_id for g in again} & {"task0", "task1", "task2", "task0@1"}
    ids = ShardReader(tmp_path / "out", name=ROLLOUTS_TABLE).read_table().column("rollout_id").to_pylist()
    assert len(ids) == len(set(ids)) and first <= set(ids)  # nothing recorded twice, nothing lost


def test_stale_rollouts_are_aborted_and_run_again(tmp_path):
    with _farm(tmp_path, 3.0, max_staleness=0, on_stale="abort", max_ahead=2) as f:
        wait_until(lambda: len(_started(tmp_path)) >= 2, timeout_s=60, what="2 rollouts started")
        f._dispatcher.set_policy_version(1)  # what update_weights tells the loop after the router's update
        groups = f.next_groups(1, timeout=120)
        stats = f.stats()
    assert len(groups) == 1 and groups[0].complete
    assert stats["stale_aborted"] == 2 and stats["policy_version"] == 1
    started = _started(tmp_path)
    assert sorted(a for rid, a in started if rid.startswith("task0.")) == [1, 1, 2, 2]  # each ran again, once
    rows = ShardReader(tmp_path / "out", name=ROLLOUTS_TABLE).read_table().to_pylist()
    kept = {r["rollout_id"]: r for r in rows}
    assert kept["task0.0"]["attempt"] == 2 and kept["task0.1"]["attempt"] == 2


def test_no_group_beyond_the_bound_is_handed_out(tmp_path):
    # every turn is stamped version 0 (FakeParts); once the farm is at version 1, bound 0
    with _farm(tmp_path, 0.1, {"version": 0}, max_staleness=0, on_stale="drop", max_ahead=2) as f:
        first = f.next_groups(1, timeout=90)
        assert [g.policy_versions for g in first] == [(0, 0)]  # fresh: handed out
        deadline = time.monotonic() + 60
        while not f._ready and time.monotonic() < deadline:
            f._take(f._reader.poll())  # a done group waits in the buffer (what the bug let through)
            time.sleep(0.1)
        f._dispatcher.set_policy_version(1)
        wait_until(lambda: f.policy_version >= 1, timeout_s=60, what="the farm at policy version 1")
        late = f.next_groups(1, timeout=3)
        assert late == [] and f.stats()["stale_groups_dropped"] >= 1


def test_farm_run_takes_the_stream_epochs(tmp_path):
    from farm.run.batch import run_batch

    cfg = _cfg(tmp_path, epochs=2, shuffle=True, seed=3)
    summary = run_batch(cfg, console=Console(file=io.StringIO()), tasks=_tasks(tmp_path, 0.1),
                       parts_factory=farm_helpers.FakeParts)
    assert summary.planned == 12 and summary.by_status == {"completed": 12}
    rows = ShardReader(tmp_path / "out", name=ROLLOUTS_TABLE).read_table().to_pylist()
    assert sorted({r["group_id"] for r in rows}) == ["task0", "task0@1", "task1", "task1@1", "task2", "task2@1"]
    assert sorted({r["group_index"] for r in rows}) == list(range(6))
