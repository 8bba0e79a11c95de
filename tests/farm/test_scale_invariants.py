"""The control plane keeps nothing per rollout (its memory must not grow with a run of
millions): the run summary is kept as rollouts finish, equal to the summary computed over
the whole list of rollouts, and the dispatcher retains the same objects after 2,000
rollouts as after 8,000. Small sizes, no clocks."""

from __future__ import annotations

import gc
import random
from collections import Counter, deque

import numpy as np
import pytest

from farm.actors import dispatch
from farm.actors.dispatch import Dispatcher
from farm.config import FarmConfig
from farm.output.rows import RolloutSummary
from farm.run.summary import RESOLVED_REWARD, Durations, RunSummary, SummaryTally
from farm.status import RolloutStatus

STATUSES = [RolloutStatus.COMPLETED] * 6 + [RolloutStatus.SANDBOX_ERROR, RolloutStatus.TIMEOUT,
                                            RolloutStatus.CANCELLED, RolloutStatus.INTERRUPTED]  # fmt: skip


def _summaries(n: int, seed: int = 0) -> list[RolloutSummary]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        out.append(RolloutSummary(
            rollout_id=f"t{i // 8}.{i % 8}", group_id=f"t{i // 8}", task_id=f"t{i // 8}",
            status=rng.choice(STATUSES), reward=rng.choice([0.0, 0.25, 1.0, 1.0]), turns=rng.randint(0, 30),
            prompt_tokens=rng.randint(0, 9000), output_tokens=rng.randint(0, 3000),
            duration_s=rng.choice([0.0, rng.uniform(0.5, 900.0)]), node=rng.choice(["", "n1", "n2", "n3"]),
            started_at=(t := rng.choice([0.0, rng.uniform(1e9, 1e9 + 5000.0)])), finished_at=t and t + rng.uniform(0, 600),
        ))  # fmt: skip
    return out


def _union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the intervals, by a sweep over their sorted ends."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def _over_the_list(run_id, summaries, *, planned, skipped_done, wall_s, redispatched, retried, interrupted):
    """The reference: the summary computed with every rollout in hand (numpy's mean and
    percentiles), as the run computed it before it kept a tally."""
    finished = [s for s in summaries if not s.status.reruns]
    resolved = sum(1 for s in finished if s.reward >= RESOLVED_REWARD)
    durations = np.array([s.duration_s for s in finished], dtype=np.float64)
    by_status = Counter(s.status.value for s in summaries)
    output_tokens = sum(s.output_tokens for s in summaries)
    busy = _union([(s.started_at, s.finished_at) for s in summaries if s.started_at > 0])
    return RunSummary(
        run_id=run_id, planned=planned, skipped_done=skipped_done, finished=len(finished),
        by_status={k: by_status[k] for k in sorted(by_status)}, resolved=resolved,
        resolved_rate=resolved / len(finished) if finished else 0.0,
        mean_reward=float(np.mean([s.reward for s in finished])) if finished else 0.0,
        turns=sum(s.turns for s in summaries), prompt_tokens=sum(s.prompt_tokens for s in summaries),
        output_tokens=output_tokens, wall_s=wall_s, busy_s=busy,
        rollouts_per_min=60.0 * len(finished) / busy if busy > 0 else 0.0,
        output_tokens_per_s=output_tokens / busy if busy > 0 else 0.0,
        duration_p50_s=float(np.percentile(durations, 50)) if len(durations) else 0.0,
        duration_p95_s=float(np.percentile(durations, 95)) if len(durations) else 0.0,
        redispatched=redispatched, retried=retried, interrupted=interrupted,
        nodes=dict(sorted(Counter(s.node for s in finished if s.node).items())),
    )  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 7, 300])
def test_tally_gives_the_summary_over_the_whole_list(n):
    rows = _summaries(n, seed=n)
    tally = SummaryTally.of(rows)
    kw = dict(planned=n + 3, skipped_done=2, wall_s=12.5, redispatched=1, retried=4, interrupted=True)
    want = _over_the_list("run", rows, **kw).model_dump()
    got = tally.summary("run", **kw).model_dump()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == (pytest.approx(value, rel=1e-12) if isinstance(value, float) else value), key


def test_durations_past_the_exact_window_stay_within_their_accuracy():
    rng = np.random.default_rng(3)
    values = rng.lognormal(mean=3.0, sigma=1.5, size=20_000)
    d = Durations(exact=500, accuracy=0.005)
    for v in values:
        d.add(float(v))
    assert d._values is None  # sketched
    for q in (1, 50, 95, 99):
        exact = float(np.percentile(values, q))
        assert d.percentile(q) == pytest.approx(exact, rel=0.02), q
    assert len(d._buckets) < 2_000


def _retained(obj, skip: set[int]) -> int:
    """What ``obj`` keeps alive (not through ``skip``): its objects other than scalars
    (whose count depends on which small ints are shared), plus the length of every container
    among them (a deque of ids growing per rollout counts there)."""
    seen: set[int] = set(skip)
    todo = [obj]
    n = 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, type):
            continue
        seen.add(id(o))
        if not isinstance(o, (int, float, str, bytes)):
            n += 1 + (len(o) if isinstance(o, (list, dict, set, frozenset, tuple, deque)) else 0)
        todo.extend(gc.get_referents(o))
    return n


class _Quiet:
    def note(self, message):
        pass

    def grow(self, n):
        pass

    def advance(self, summary, in_flight):
        pass


def test_the_dispatcher_keeps_nothing_per_rollout(monkeypatch):
    monkeypatch.setattr(dispatch, "RECENT_IDS", 256)
    monkeypatch.setattr(Durations.__init__, "__defaults__", (256, 0.005))  # sketched from 256 durations on
    cfg = FarmConfig()
    d = Dispatcher(cfg, {}, reducer=None, progress=_Quiet(), tally=SummaryTally())
    base = [s.model_copy(update={"duration_s": float(1 + i % 50)}) for i, s in enumerate(_summaries(400))]
    skip = {id(cfg), id(d.progress)}

    def finish(start: int, stop: int) -> None:
        for i in range(start, stop):
            d._finish(base[i % len(base)].model_copy(update={"rollout_id": f"r{i}"}))

    finish(0, 2_000)
    gc.collect()
    after_2k = _retained(d, skip)
    finish(2_000, 8_000)
    gc.collect()
    assert d.finished == 8_000
    assert _retained(d, skip) == after_2k


def test_a_rollout_handed_back_twice_counts_once():
    d = Dispatcher(FarmConfig(), {}, reducer=None, progress=_Quiet(), tally=SummaryTally())
    s = _summaries(3)
    for x in (s[0], s[1], s[0], s[2], s[1]):
        d._finish(x)
    assert d.finished == 3


def test_the_store_keeps_recent_summaries_and_reads_older_ones_back(tmp_path):
    from farm_helpers import make_result, reducer_config

    from farm.output.writer import OutputWriter

    cfg = reducer_config(tmp_path / "out")
    store = OutputWriter(cfg.output.dir, cfg.output)
    store.summaries._cache = 4
    results = [make_result(f"g{i // 4}.{i % 4}", reward=float(i % 2)) for i in range(12)]
    for r in results:
        store.add(r, [])
    store.commit(store.take_buffer())
    assert len(store.summaries._recent) == 4  # not one per rollout
    assert len(store.summaries) == 12 and set(store.summaries) == {r.rollout_id for r in results}
    for r in results:  # the first 8 are read back from the rollouts shard
        assert store.summaries[r.rollout_id] == r.summary(), r.rollout_id
    assert "g9.0" not in store.summaries and store.summaries.get("g9.0") is None
    store.close()
    reopened = OutputWriter(cfg.output.dir, cfg.output)  # resume: nothing read into memory per rollout
    assert len(reopened.summaries._recent) == 0 and len(reopened.summaries) == 12
    assert reopened.summaries["g0.1"].reward == 1.0
    reopened.close()


def test_a_following_group_reader_keeps_no_id_per_rollout(tmp_path, monkeypatch):
    from farm_helpers import make_result, reducer_config

    from farm.output import groups as group_reader
    from farm.output.groups import GroupReader
    from farm.output.writer import OutputWriter

    monkeypatch.setattr(group_reader, "CLOSED_GROUPS", 3)
    cfg = reducer_config(tmp_path / "out")
    store = OutputWriter(cfg.output.dir, cfg.output)
    reader = GroupReader(cfg.output.dir, size=2)
    got = []
    for batch in range(5):
        for g in range(2):
            for k in range(2):
                store.add(make_result(f"b{batch}g{g}.{k}"), [])
        store.commit(store.take_buffer())
        got += [g.group_id for g in reader.poll()]
    assert got == [f"b{b}g{g}" for b in range(5) for g in range(2)]
    assert len(reader._closed_ids) == 3 and not reader._pending
    store.close()


def test_the_directory_summary_reads_one_shard_at_a_time(tmp_path, monkeypatch):
    """The run's end (summary.json's ``cumulative``) and ``farm inspect`` fold the rollouts
    table shard by shard: never the whole table as one list of rows (10^5 rows as dicts
    took 1.8 GB), and the same counts as over the whole list."""
    from farm_helpers import make_result, reducer_config

    from farm.output.reader import OutputReader
    from farm.output.shard_reader import ShardReader
    from farm.output.writer import OutputWriter
    from farm.run.summary import cumulative, directory_summary

    cfg = reducer_config(tmp_path / "out")
    store = OutputWriter(cfg.output.dir, cfg.output)
    statuses = [RolloutStatus.COMPLETED, RolloutStatus.SANDBOX_ERROR, RolloutStatus.COMPLETED, RolloutStatus.TIMEOUT]
    for shard in range(5):
        for k in range(3):
            i = shard * 3 + k
            store.add(make_result(f"g{i // 4}.{i % 4}", reward=float(i % 3 == 0), status=statuses[i % 4]), [])
        store.commit(store.take_buffer())
    store.close()
    rows = OutputReader(cfg.output.dir).rollout_rows()
    want = cumulative(rows, 0, group_size=4)
    assert want.rollouts == 15 and want.groups == 4 and want.by_status == {"completed": 8, "sandbox_error": 4, "timeout": 3}

    def whole_table(self):
        raise AssertionError("read the whole rollouts table at once")

    monkeypatch.setattr(ShardReader, "read_table", whole_table)
    assert directory_summary(cfg.output.dir, group_size=4) == want
