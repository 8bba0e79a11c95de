"""The run's plan and summary as pure functions: expansion, resume, summary
(farm.run.stream, farm.run.summary). Re-dispatch: tests/rollout/test_rollout_retry.py;
picking an actor: tests/actors/test_actors_pool.py."""

from __future__ import annotations

import json

import pytest

from farm.output.rows import RolloutSummary
from farm.run.stream import expand_rollouts
from farm.output.groups import group_states
from farm.run.summary import cumulative, summarize, summary_table, write_summary
from farm.status import RolloutStatus
from farm.tasks.model import Task


def _tasks(*ids: str) -> list[Task]:
    return [Task(id=i, instruction=f"fix {i}") for i in ids]


def test_expand_groups_and_stable_ids():
    specs = expand_rollouts("r", _tasks("a", "b-1"), 3)
    assert [s.rollout_id for s in specs] == ["a.0", "a.1", "a.2", "b-1.0", "b-1.1", "b-1.2"]
    assert {s.group_id for s in specs[:3]} == {"a"} and {s.group_id for s in specs[3:]} == {"b-1"}
    assert [s.sample_index for s in specs[:3]] == [0, 1, 2]
    assert all(s.run_id == "r" and s.attempt == 1 for s in specs)
    # Same plan on every call: resume relies on it.
    assert [s.rollout_id for s in expand_rollouts("r", _tasks("a", "b-1"), 3)] == [s.rollout_id for s in specs]


def test_expand_skips_done_and_limit_applies_before_skipping():
    tasks = _tasks("a", "b", "c")
    assert [s.rollout_id for s in expand_rollouts("r", tasks, 2, done={"a.1", "c.0"})] == ["a.0", "b.0", "b.1", "c.1"]
    # limit=3 plans a.0 a.1 b.0 both times; a rerun with a.0 done runs only the rest of those 3.
    assert [s.rollout_id for s in expand_rollouts("r", tasks, 2, limit=3, done={"a.0"})] == ["a.1", "b.0"]


def test_expand_rejects_duplicate_task_ids():
    with pytest.raises(ValueError, match="duplicate"):
        expand_rollouts("r", _tasks("a", "a"), 1)


def _s(rid: str, status: RolloutStatus, reward: float = 0.0, dur: float = 1.0, out: int = 10,
       at: float = 0.0) -> RolloutSummary:
    return RolloutSummary(rollout_id=rid, group_id="g", task_id="t", status=status, reward=reward, turns=2,
                          prompt_tokens=100, output_tokens=out, duration_s=dur, started_at=at,
                          finished_at=at + dur if at else 0.0)  # fmt: skip


def test_summary_counts_rates_and_percentiles(tmp_path):
    S = RolloutStatus
    # running: a 1000-1001, b 1000.5-1002.5, c 1010-1013 (a gap of 7.5 s between), d (cancelled) 1012-1112
    rows = [_s("a", S.COMPLETED, 1.0, 1.0, at=1000.0), _s("b", S.COMPLETED, 0.0, 2.0, at=1000.5),
            _s("c", S.TIMEOUT, 0.0, 3.0, at=1010.0), _s("d", S.CANCELLED, 0.0, 100.0, out=5, at=1012.0)]
    summ = summarize("r", rows, planned=5, skipped_done=1, wall_s=300.0, redispatched=1)
    assert summ.by_status == {"cancelled": 1, "completed": 2, "timeout": 1}
    assert (summ.finished, summ.resolved) == (3, 1)
    assert summ.resolved_rate == pytest.approx(1 / 3)
    assert summ.duration_p50_s == pytest.approx(2.0)  # cancelled excluded
    assert summ.duration_p95_s == pytest.approx(2.9)
    assert (summ.turns, summ.output_tokens) == (8, 35)
    # the rates are over busy time (what farm report's are over), not the command's wall time
    assert (summ.wall_s, summ.busy_s) == (300.0, pytest.approx(2.5 + 102.0))
    assert summ.rollouts_per_min == pytest.approx(60 * 3 / 104.5)
    assert summ.output_tokens_per_s == pytest.approx(35 / 104.5)
    labels = [row[0] for row in _table_rows(summary_table(summ))]
    assert {"wall time (start-up to exit)", "busy time (rollouts running)", "throughput (over busy time)"} <= set(labels)
    path = write_summary(summ, tmp_path)
    assert json.loads(path.read_text())["by_status"]["timeout"] == 1
    assert summary_table(summ).row_count > 10
    empty = summarize("r", [], planned=0, wall_s=0.0)
    assert empty.resolved_rate == 0.0 and empty.duration_p95_s == 0.0


def test_groups_and_grading_flags_are_counted_over_the_directory():
    def row(group: str, i: int, status: str, reward: float = 0.0) -> dict:
        return {"group_id": group, "sample_index": i, "status": status, "reward": reward, "attempt": 1}

    rows = [row("a", 0, "completed", 1.0), row("a", 1, "timeout"), row("a", 2, "patch_failed"),  # all policy
            row("b", 0, "completed", 1.0), row("b", 1, "engine_error"), row("b", 2, "completed"),  # one infra
            row("c", 0, "completed"), row("c", 1, "completed")]  # one not recorded yet  # fmt: skip
    groups = group_states(rows, 3)
    assert {g: (s.complete, s.missing) for g, s in groups.items()} == {"a": (True, 0), "b": (False, 1), "c": (False, 1)}
    rows[1]["grading"] = json.dumps({"flags": ["runtime:body_not_run", "static:early_exit"], "hack_action": "zero_reward"})
    rows[2]["grading"] = json.dumps({"flags": ["static:early_exit"]})
    c = cumulative(rows, 1, group_size=3)
    assert (c.groups, c.groups_complete, c.groups_incomplete, c.incomplete_groups) == (3, 1, 2, ["b", "c"])
    assert c.grading_flags == {"runtime:body_not_run": 1, "static:early_exit": 2} and c.hack_actions == {"zero_reward": 1}


def test_farm_run_config_errors_are_clear(tmp_path, capsys):
    from farm.cli import main

    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  concurrency: 0\n")
    assert main(["run", str(bad)]) == 2
    assert "concurrency" in capsys.readouterr().err


def _table_rows(table) -> list[list[str]]:
    cols = [list(c.cells) for c in table.columns]
    return [list(r) for r in zip(*cols)]
