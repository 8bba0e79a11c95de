"""Continuous mode without Ray: the task stream, back-pressure, groups read as they are
done (real reducer, real shards), and the staleness rules at record time."""

from __future__ import annotations

import asyncio

import pytest

from farm.actors.reducer import ReducerActor
from farm.config import FarmConfig
from farm.output.groups import GroupReader
from farm.rollout.retry import Reruns, RetryKind
from farm.run.stream import StreamConfig, StreamFeed, TaskStream
from farm.status import RolloutStatus, Verdict
from farm.tasks.model import Task
from farm.trajectory.schema import to_slime_dict
from farm.trajectory.tree import TurnTree

from farm_helpers import make_result


def _tasks(n: int) -> list[Task]:
    return [Task(id=f"t{i}", instruction=f"do {i}") for i in range(n)]


def test_stream_epochs_ids_and_group_indexes():
    s = TaskStream("r", _tasks(3), 2, StreamConfig(epochs=2))
    groups = list(s)
    assert [g[0].group_id for g in groups] == ["t0", "t1", "t2", "t0@1", "t1@1", "t2@1"]
    assert [g[0].group_index for g in groups] == list(range(6))
    assert [s.rollout_id for s in groups[3]] == ["t0@1.0", "t0@1.1"] and groups[3][0].epoch == 1
    # epoch 0 plans exactly what farm run always planned (resume depends on the ids)
    from farm.run.stream import expand_rollouts

    assert [x.rollout_id for x in expand_rollouts("r", _tasks(3), 2)] == [x.rollout_id for g in groups[:3] for x in g]
    # done rollouts are skipped, group indexes stay where they were
    again = list(TaskStream("r", _tasks(3), 2, StreamConfig(epochs=1), done={"t0.0", "t0.1", "t1.0"}))
    assert [(g[0].group_index, [x.rollout_id for x in g]) for g in again] == [(1, ["t1.1"]), (2, ["t2.0", "t2.1"])]


def test_stream_shuffle_is_seeded_per_epoch_and_endless_streams_go_on():
    cfg = StreamConfig(epochs=None, shuffle=True, seed=7)
    a, b = iter(TaskStream("r", _tasks(8), 1, cfg)), iter(TaskStream("r", _tasks(8), 1, cfg))
    first = [next(a)[0].task.id for _ in range(40)]
    assert first == [next(b)[0].task.id for _ in range(40)]  # same seed, same order (a resume replays it)
    epochs = [first[i:i + 8] for i in range(0, 40, 8)]
    assert all(sorted(e) == [f"t{i}" for i in range(8)] for e in epochs)  # every task once per epoch
    assert len({tuple(e) for e in epochs}) > 1  # a new order each epoch
    with pytest.raises(ValueError, match="endless"):
        TaskStream("r", _tasks(2), 1, cfg).plan()


def test_curriculum_hook_sees_rewards_and_orders_the_epoch():
    seen = []

    def hardest_first(epoch, tasks, rewards):
        seen.append((epoch, {k: list(v) for k, v in rewards.items()}))
        return sorted(tasks, key=lambda t: sum(rewards.get(t.id, [0.0])))[::-1][:2]

    s = TaskStream("r", _tasks(3), 1, StreamConfig(epochs=2), curriculum=hardest_first)
    it = iter(s)
    assert [next(it)[0].task.id for _ in range(2)] == ["t2", "t1"]
    s.observe("t0", 1.0)
    assert next(it)[0].group_id == "t0@1" and seen[-1] == (1, {"t0": [1.0]})


def test_feed_back_pressure_counts_rollouts_ahead():
    feed = StreamFeed(TaskStream("r", _tasks(5), 2, StreamConfig(epochs=1)), max_ahead=4)
    assert feed.next() and feed.next()  # 4 ahead
    assert feed.next() is None and feed.ahead == 4 and not feed.exhausted
    feed.consumed(2)
    g = feed.next()
    assert g is not None and g[0].group_id == "t2"  # the group held back is not lost
    feed.consumed(4)
    assert feed.next()[0].group_id == "t3" and feed.next()[0].group_id == "t4"
    assert feed.next() is None and not feed.exhausted  # held back: not known to be the end yet
    feed.consumed(4)
    assert feed.next() is None and feed.exhausted
    # one group bigger than the bound still runs (alone)
    big = StreamFeed(TaskStream("r", _tasks(2), 8, StreamConfig(epochs=1)), max_ahead=4)
    assert len(big.next()) == 8 and big.next() is None


def _versioned_result(rid: str, versions: list[int], *, status=RolloutStatus.COMPLETED, reward=1.0,
                      reruns: Reruns = Reruns()):
    r = make_result(rid, status=status, reward=reward)
    tree = TurnTree(rid)
    parent = None
    for k, v in enumerate(versions):
        rec = tree.append(parent_id=parent, prompt_delta_ids=[10 + k, 11 + k] if parent is None else [7],
                          output_ids=[100 + k], output_logprobs=[-0.5], finish_reason="stop", policy_version=v)
        parent = rec.turn_id
    return r.model_copy(update={"tree": tree, "attempt": 1 + reruns.total, "reruns": reruns,
                                "group_index": int(rid[1]) if rid[1].isdigit() else None})


def _cfg(out, **stream) -> FarmConfig:
    return FarmConfig.model_validate({"run_id": "t", "output": {"dir": str(out)}, "ray": {"reducer_flush_s": 0.05},
                                      "rollout": {"n_samples": 2}, "stream": stream})


async def test_group_reader_yields_done_groups_in_both_orders(tmp_path):
    red = ReducerActor(_cfg(tmp_path), metrics=False)
    reader_c = GroupReader(tmp_path, size=2, order="completion")
    reader_t = GroupReader(tmp_path, size=2, order="task")
    await red.submit(_versioned_result("t1.0", [0, 1], reward=1.0))
    await red.submit(_versioned_result("t1.1", [1], reward=0.0))
    await red.submit(_versioned_result("t0.0", [0]))
    done_c, done_t = reader_c.poll(), reader_t.poll()
    assert [g.group_id for g in done_c] == ["t1"]
    assert done_t == []  # task order: t1 waits for t0
    g = done_c[0]
    assert g.complete and g.rewards == [1.0, 0.0] and g.reward_mean == 0.5 and g.reward_std == pytest.approx(0.5 ** 0.5)
    assert g.resolved == 1 and g.policy_versions == (0, 1) and g.group_index == 1
    assert [s.rollout_id for s in g.samples] == ["t1.0", "t1.1"]
    assert [(s.policy_version_min, s.policy_version_max) for s in g.samples] == [(0, 1), (1, 1)]
    # slime sees an int group index (the task id is a string) and distinct indexes
    d0, d1 = (to_slime_dict(s) for s in g.samples)
    assert d0["group_index"] == d1["group_index"] == 1 and d0["index"] != d1["index"]
    # an infrastructure failure (after its retries) makes its group incomplete: left out, reported
    out_of_retries = Reruns(infrastructure=_cfg(tmp_path).rollout.infra_retries)  # else the reducer hands it back
    await red.submit(_versioned_result("t0.1", [], status=RolloutStatus.ENGINE_ERROR, reward=0.0, reruns=out_of_retries))
    assert reader_c.poll() == [] and reader_c.incomplete == ["t0"]
    assert [x.group_id for x in reader_t.poll()] == ["t1"] and reader_t.incomplete == ["t0"]
    everything = GroupReader(tmp_path, size=2, include_incomplete=True).read()
    assert sorted((x.group_id, x.complete) for x in everything) == [("t0", False), ("t1", True)]
    assert [len(x.samples) for x in sorted(everything, key=lambda x: x.group_id)] == [1, 2]
    await red.close()


async def test_stale_rollouts_are_dropped_then_rerun_then_recorded_as_stale(tmp_path):
    red = ReducerActor(_cfg(tmp_path, max_staleness=1, on_stale="drop", max_stale_reruns=1), metrics=False)
    await red.set_policy_version(3)
    fresh = await red.submit(_versioned_result("t0.0", [2, 3]))
    assert fresh.durable and fresh.status is RolloutStatus.COMPLETED  # staleness 1: kept
    dropped = await red.submit(_versioned_result("t0.1", [1, 3]))
    assert not dropped.durable and dropped.status is RolloutStatus.STALE and "staleness 2" in dropped.reason
    assert "t0.1" not in await red.done_ids()
    # its actor died twice since: that spends the actor-death budget, not the stale one
    again = await red.submit(_versioned_result("t0.1", [1], reruns=Reruns(actor_lost=2)))
    assert not again.durable and again.retry.kind is RetryKind.STALE
    last = await red.submit(_versioned_result("t0.1", [1], reruns=Reruns(stale=1)))  # out of reruns: recorded, no Samples
    assert last.durable and last.status is RolloutStatus.STALE
    # the run stops (the dispatcher tells the reducer as it tells the actors): a stale attempt that did
    # not finish to its end is dropped for the next invocation, as a sandbox actor drops one
    await red.stop_accepting()
    stopped = await red.submit(_versioned_result("t1.0", [1], status=RolloutStatus.TIMEOUT))
    assert not stopped.durable and stopped.retry.verdict is Verdict.DROP and stopped.status is RolloutStatus.INTERRUPTED
    graded = await red.submit(_versioned_result("t1.1", [1]))  # one graded is kept as graded: run again
    assert not graded.durable and graded.retry.runs_again and graded.status is RolloutStatus.STALE
    await red.close()
    groups = GroupReader(tmp_path, size=2, include_incomplete=True).read()
    assert [(g.complete, len(g.samples)) for g in groups] == [(False, 1)]
    row = {r["rollout_id"]: r for r in groups[0].rollouts}["t0.0"]
    assert row["policy_version_at_finish"] == 3 and (row["policy_version_min"], row["policy_version_max"]) == (2, 3)


async def test_keep_policy_records_stale_rollouts_with_their_versions(tmp_path):
    red = ReducerActor(_cfg(tmp_path, max_staleness=0, on_stale="keep"), metrics=False)
    await red.set_policy_version(5)
    kept = await red.submit(_versioned_result("t0.0", [1, 2]))
    assert kept.durable and kept.status is RolloutStatus.COMPLETED
    await red.close()
    (s,) = GroupReader(tmp_path, size=1).read()[0].samples
    assert (s.policy_version_min, s.policy_version_max) == (1, 2) and s.metadata["policy_version_at_finish"] == 5


def test_reader_never_yields_a_group_short(tmp_path):
    # a rollout row visible but its Samples not (yet): the group waits
    async def go():
        red = ReducerActor(_cfg(tmp_path), metrics=False)
        await red.submit(_versioned_result("t0.0", [0]))
        await red.submit(_versioned_result("t0.1", [0]))
        await red.close()

    asyncio.run(go())
    reader = GroupReader(tmp_path, size=2)
    reader._sample_tail.new_entries = lambda: []  # the Sample manifest lags behind the rollouts one
    assert reader.poll() == []
    del reader._sample_tail.new_entries
    assert [len(g.samples) for g in reader.poll()] == [2]


def test_one_staleness_rule_acts_where_its_policy_says():
    """StreamConfig.too_stale is the one rule the dispatcher (running), the reducer (recorded)
    and farm.Farm (handed out) ask: the bound is strict, and each policy acts at its stages."""
    from farm.run.config import StreamConfig

    acts = {"keep": set(), "drop": {"recorded", "handed_out"}, "abort": {"running", "handed_out"}}
    for policy, stages in acts.items():
        stream = StreamConfig(max_staleness=1, on_stale=policy)
        for stage in ("running", "recorded", "handed_out"):
            assert stream.too_stale(3, 5, stage) is (stage in stages), (policy, stage)
            assert not stream.too_stale(4, 5, stage) and not stream.too_stale(None, 5, stage)  # within / unversioned
    assert not StreamConfig(on_stale="drop").too_stale(0, 99, "recorded")  # no bound
