"""A finite run's plan is pulled group by group (nothing grows per rollout in the driver, so
a million-rollout run holds no million specs): ``RunSession.plan`` makes no spec up front,
its counts are arithmetic, and what the feed hands out is what the eager plan (every spec
in one list, then the limit, then the done ones left out) was: same rollouts, same order,
same counts. Fast: no Ray."""

from __future__ import annotations

import tracemalloc

import pytest

from farm.actors.dispatch import Dispatcher
from farm.config import FarmConfig
from farm.output.rows import RolloutSummary
from farm.rollout.outcome import Ending
from farm.run.session import RunSession
from farm.run.stream import StreamConfig, StreamFeed, TaskStream
from farm.run.summary import SummaryTally
from farm.status import RolloutStatus
from farm.tasks.model import Task


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction="x") for i in range(n)]


def _config(tmp_path, n_samples: int, *, limit: int | None = None, **stream) -> FarmConfig:
    return FarmConfig.model_validate({"run_id": "lazy", "output": {"dir": str(tmp_path / "out")},
                                      "rollout": {"n_samples": n_samples, "limit": limit}, "stream": stream})


def _eager(tasks, n, cfg: StreamConfig, done: set[str], limit: int | None, curriculum=None):
    """The reference: the plan as ``farm run`` made it before, every spec of the stream
    in one list, cut at ``limit``, the done ones left out: ((rollout id, group index)
    of each rollout to run, skipped)."""
    everything = [s for g in TaskStream("lazy", tasks, n, cfg, curriculum=curriculum) for s in g]
    capped = everything if limit is None else everything[:limit]
    todo = [(s.rollout_id, s.group_index) for s in capped if s.rollout_id not in done]
    return todo, len(capped) - len(todo)


def _drain(feed: StreamFeed) -> list[list[tuple[str, int]]]:
    groups = []
    while (group := feed.next()) is not None:
        assert len({s.group_id for s in group}) == 1  # one group at a time
        groups.append([(s.rollout_id, s.group_index) for s in group])
    assert feed.exhausted
    return groups


ELSEWHERE = {"other.0", "t1@9.0", "zz.3"}  # done ids of another config: never in this plan

CASES = {  # name: (tasks, n_samples, limit, stream config, done)
    "fresh": (5, 3, None, {}, set()),
    "resumed": (5, 3, None, {}, {"t0.0", "t0.1", "t0.2", "t2.1"} | ELSEWHERE),
    "limit cuts a group": (5, 3, 7, {}, set()),
    "limit, resumed (done ids past the limit not skipped)": (5, 3, 7, {}, {"t0.1", "t2.0", "t2.1", "t4.0"} | ELSEWHERE),
    "epochs": (4, 2, None, {"epochs": 3}, {"t1.0", "t3@1.1", "t0@2.0"}),
    "shuffled epochs with a limit": (6, 2, 17, {"epochs": 2, "shuffle": True, "seed": 5}, {"t5@1.0", "t2.1"} | ELSEWHERE),
    "everything done": (3, 2, None, {}, {f"t{i}.{k}" for i in range(3) for k in range(2)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_pulled_plan_is_the_eager_plan(tmp_path, case):
    n_tasks, n, limit, stream, done = CASES[case]
    tasks = _tasks(n_tasks)
    want, skipped = _eager(tasks, n, StreamConfig(**stream), done, limit)
    with RunSession(_config(tmp_path, n, limit=limit, **stream), tasks=tasks) as session:
        session.resume([], set(done))
        plan = session.plan()
        assert (plan.total, plan.skipped, session.skipped) == (len(want), skipped, skipped)
        assert bool(plan) == bool(want)
        got = _drain(plan.feed)
    assert [r for g in got for r in g] == want


def test_a_curriculum_plan_counts_what_it_hands_out():
    def two_reversed(epoch, tasks, rewards):
        return list(reversed(tasks))[: 2 + epoch]

    cfg, done = StreamConfig(epochs=2), {"t3.1", "t2@1.0", "nope.0"}
    for limit in (None, 5, 100):
        want, skipped = _eager(_tasks(4), 2, cfg, done, limit, curriculum=two_reversed)
        stream = TaskStream("lazy", _tasks(4), 2, cfg, curriculum=two_reversed, done=done)
        assert stream.count(limit) == (len(want), skipped)
        assert [r for g in _drain(StreamFeed(stream, limit=limit)) for r in g] == want


def test_planning_ten_thousand_groups_makes_no_spec_up_front(tmp_path):
    tasks = _tasks(10_000)
    tracemalloc.start()
    try:
        one_percent = [s for g in TaskStream("lazy", tasks[:100], 8) for s in g]  # what 800 specs cost
        cost = tracemalloc.get_traced_memory()[0]
        del one_percent
        with RunSession(_config(tmp_path, 8), tasks=tasks) as session:
            session.resume([], {f"t{i}.{k}" for i in range(0, 1_000, 3) for k in range(8)})  # resumed
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            plan = session.plan()
            planning = tracemalloc.get_traced_memory()[1] - base
            assert (plan.total, plan.skipped) == (80_000 - 334 * 8, 334 * 8)
            tracemalloc.reset_peak()
            groups = 0
            while (group := plan.feed.next()) is not None:  # every group, each let go once dispatched
                assert len(group) == 8
                groups += 1
            pulling = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert groups == 10_000 - 334
    # 80,000 specs would cost 100 times ``cost``: planning and pulling all stay below 1%
    assert planning < cost and pulling < cost, (planning, pulling, cost)


class _Progress:
    def __init__(self) -> None:
        self.grown = 0

    def note(self, message: str) -> None:
        pass

    def grow(self, n: int) -> None:
        self.grown += n

    def advance(self, summary, in_flight: int) -> None:
        pass


def test_with_no_actor_left_the_rest_of_a_finite_plan_is_recorded_failed():
    """What the eager plan did with every queued rollout (the run ends, each one counted):
    the rest of the feed is pulled and recorded, the known total is not grown."""
    stream = TaskStream("lazy", _tasks(6), 2)
    total, _ = stream.count()
    progress, recorded = _Progress(), []
    d = Dispatcher(FarmConfig(), {}, reducer=None, progress=progress, tally=SummaryTally())

    def end(spec, ending, reason, actor):  # the reducer's part: it records a rollout given up at once
        recorded.append((spec.rollout_id, ending, reason))
        return RolloutSummary(rollout_id=spec.rollout_id, group_id=spec.group_id, task_id=spec.task.id,
                              status=RolloutStatus.SANDBOX_ERROR, reason=reason)  # fmt: skip

    d._end = end
    d.run(feed=StreamFeed(stream, total=total))
    assert [r[0] for r in recorded] == [f"t{i}.{k}" for i in range(6) for k in range(2)]
    assert {(r[1], r[2]) for r in recorded} == {(Ending.GIVEN_UP, "no sandbox actor left alive")}
    assert d.finished == total == 12 and progress.grown == 0


def test_the_dispatcher_pulls_groups_for_its_free_slots_only():
    """The driver holds what is queued for free slots, not the plan; a finite feed's total
    was told up front (not grown), an endless one's grows as groups are pulled."""
    cfg = FarmConfig.model_validate({"rollout": {"concurrency": 4}})
    for epochs, grown in ((1, 0), (None, 6)):
        stream = TaskStream("lazy", _tasks(100), 3, StreamConfig(epochs=epochs))
        feed = StreamFeed(stream, total=stream.count()[0] if epochs else None)
        progress = _Progress()
        d = Dispatcher(cfg, {"a0": None}, reducer=None, progress=progress, tally=SummaryTally())
        d._feed(feed)
        assert [s.rollout_id for s in d.queue] == ["t0.0", "t0.1", "t0.2", "t1.0", "t1.1", "t1.2"]
        assert progress.grown == grown and feed.next()[0].group_id == "t2"  # the rest not pulled yet
        d.pool.took("a0")
        d.queue.clear()
        d._feed(feed)  # 3 slots free: one group
        assert [s.group_id for s in d.queue] == ["t3"] * 3
