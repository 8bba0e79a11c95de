"""The run session (farm.run.session) every entry point opens and closes: lock first,
run_config.yaml, tasks, loggers, resume, close -> summary.json + invocations.jsonl,
loggers closed, lock released. Fast: no Ray, no actors."""

from __future__ import annotations

import json

import pytest
import yaml

from farm.config import FarmConfig
from farm.errors import TaskError
from farm.output.rows import RolloutSummary
from farm.run.lock import RunLock, RunLocked
from farm.run.session import RunSession, RunTally
from farm.status import RolloutStatus
from farm.tasks.model import Task

TASKS = [Task(id=t, instruction=f"fix {t}") for t in ("a", "b")]


def config(tmp_path, **extra) -> FarmConfig:
    return FarmConfig.model_validate({"run_id": "sess", "output": {"dir": str(tmp_path / "out")},
                                      "rollout": {"n_samples": 2}, **extra})  # fmt: skip


def lock_is_free(out_dir) -> bool:
    try:
        RunLock(out_dir, "probe").acquire().release()
    except RunLocked:
        return False
    return True


class Sink:
    """A run logger that remembers what it was sent."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.summary: dict | None = None

    def start(self, run_id, config):
        self.calls.append("start")

    def log_metrics(self, metrics, step):
        self.calls.append("metrics")

    def log_summary(self, summary, rows):
        self.calls.append("summary")
        self.summary = summary

    def close(self):
        self.calls.append("close")


def test_open_takes_the_lock_first_and_a_second_session_touches_nothing(tmp_path):
    first = RunSession(config(tmp_path), tasks=TASKS).open()
    written = (tmp_path / "out" / "run_config.yaml").read_text()
    assert yaml.safe_load(written)["rollout"]["n_samples"] == 2 and first.tasks == TASKS
    other = RunSession(config(tmp_path, rollout={"n_samples": 5}), tasks=TASKS)
    with pytest.raises(RunLocked, match="already running"):
        other.open()
    assert (tmp_path / "out" / "run_config.yaml").read_text() == written  # the refused one wrote nothing
    assert other.close() is None and not lock_is_free(tmp_path / "out")  # closing it frees nothing of first's
    first.close()
    assert lock_is_free(tmp_path / "out")


def test_output_dir_is_resolved_once_for_everyone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = FarmConfig.model_validate({"run_id": "sess", "output": {"dir": "rel/out"}})
    session = RunSession(cfg, tasks=TASKS)
    assert session.out_dir == tmp_path / "rel" / "out" and session.cfg.output.dir == str(session.out_dir)


def test_close_writes_the_summary_once_closes_loggers_and_releases_the_lock(tmp_path):
    session = RunSession(config(tmp_path), tasks=TASKS, command="rollouts").open()
    sink = Sink()
    session.loggers.add(sink, name="sink")
    session.resume(["repaired a torn shard"], {"a.0"})
    plan = session.plan()
    assert (plan.total, plan.skipped) == (3, 1) and plan
    assert [[s.rollout_id for s in plan.feed.next()] for _ in range(2)] == [["a.1"], ["b.0", "b.1"]]
    assert plan.feed.next() is None and plan.feed.exhausted
    done = RolloutSummary(rollout_id="a.1", task_id="a", group_id="a", status=RolloutStatus.COMPLETED, reward=1.0)
    tally = RunTally.of_summaries([done], planned=3)
    tally.retried, tally.lost_nodes = 1, {"n1": "died"}
    summary = session.close(tally)
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk == summary.model_dump(mode="json")
    assert (summary.planned, summary.skipped_done, summary.finished, summary.resolved, summary.retried) == (3, 1, 1, 1, 1)
    assert summary.recovery == ["repaired a torn shard"] and summary.lost_nodes == {"n1": "died"}
    lines = (tmp_path / "out" / "invocations.jsonl").read_text().splitlines()
    assert [json.loads(ln)["command"] for ln in lines] == ["rollouts"]
    assert sink.calls == ["summary", "close"] and sink.summary["run_id"] == "sess"
    assert lock_is_free(tmp_path / "out") and not session.is_open
    assert session.close(RunTally(planned=9)) is summary  # idempotent: nothing written twice
    assert len((tmp_path / "out" / "invocations.jsonl").read_text().splitlines()) == 1
    with pytest.raises(RuntimeError, match="closed run session"):
        session.open()


def test_nothing_ran_leaves_the_summary_alone(tmp_path):
    with RunSession(config(tmp_path), tasks=TASKS) as session:
        assert session.is_open and not lock_is_free(tmp_path / "out")
    assert session.summary is None and not (tmp_path / "out" / "summary.json").exists()
    assert lock_is_free(tmp_path / "out")


def test_a_failure_in_open_releases_the_lock(tmp_path):
    cfg = config(tmp_path, tasks={"path": str(tmp_path / "missing.jsonl")})
    session = RunSession(cfg)
    with pytest.raises(TaskError):
        session.open()
    assert lock_is_free(tmp_path / "out") and not session.is_open
    RunSession(config(tmp_path), tasks=TASKS).open().close()  # the directory is anyone's again


def test_continuous_plan_pulls_groups_and_counts_done_as_skipped(tmp_path):
    with RunSession(config(tmp_path, stream={"max_ahead": 4}), tasks=TASKS) as session:
        session.resume([], {"a.0", "a.1"})
        plan = session.plan(continuous=True)
        assert plan and plan.total is None and plan.skipped == 2
        assert [s.rollout_id for s in plan.feed.next()] == ["b.0", "b.1"]


def test_a_run_of_groups_of_one_says_at_its_start_what_that_gives_a_trainer(tmp_path):
    """farm run and farm.Farm print it first (rollout.n_samples: 1, the demo config's):
    every group-relative advantage of such a run is 0."""
    import io

    from rich.console import Console

    def start_lines(n_samples: int) -> list[str]:
        out = io.StringIO()
        cfg = config(tmp_path, run_id="").model_copy(update={"rollout": config(tmp_path).rollout.model_copy(
            update={"n_samples": n_samples})})  # fmt: skip
        RunSession(cfg, console=Console(file=out, force_terminal=False, width=400)).progress(4).close()
        return out.getvalue().splitlines()

    first, note = start_lines(1)
    assert first == f"farm run out: 4 rollouts to run into {tmp_path / 'out'}"  # the run id: the directory's name
    assert note.startswith("note: groups of one rollout (rollout.n_samples: 1): a group-relative advantage")
    assert len(start_lines(2)) == 1  # groups to train on: nothing to say
