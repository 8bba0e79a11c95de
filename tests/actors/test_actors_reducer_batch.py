"""Many rollouts per reducer call (a Ray call per rollout costs the reducer ~1 ms of CPU:
a ceiling on short rollouts): ``ReducerActor.submit_many``, the sandbox actor's
``ReducerLink`` in front of it, and the reducer's counters summed per commit.
In-process, real Arrow files."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from pathlib import Path

import pytest

from farm.actors import metrics, reducer_link
from farm.actors.reducer import ReducerActor
from farm.actors.reducer_link import ReducerLink
from farm.output.rows import RolloutSummary
from farm.status import RolloutStatus

from farm_helpers import make_result, reducer_config


def _manifest_lines(path: Path) -> list[list[str]]:
    """The rollout ids of each commit (one manifest line each)."""
    if not path.exists():
        return []
    return [json.loads(line)["rollout_ids"] for line in path.read_text().splitlines() if line.strip()]


def _failing_linearize(red: ReducerActor, bad: str) -> None:
    real = red._linearize

    def linearize(result):
        if result.rollout_id == bad:
            raise ValueError("no tokens in turn 3")
        return real(result)

    red._linearize = linearize


async def test_submit_many_answers_each_rollout_once_and_durable(tmp_path):
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    _failing_linearize(red, "bad.0")
    batch = [make_result("a.0"), make_result("bad.0"), make_result("a.1", reward=0.0),
             make_result("a.0", status=RolloutStatus.TIMEOUT, reward=0.0),  # the same id again, in the same call
             make_result("c.0", status=RolloutStatus.CANCELLED, reward=0.0)]  # fmt: skip
    answers = await red.submit_many(batch)
    # durable on return, all in one commit (one manifest line per table)
    assert _manifest_lines(tmp_path / "rollouts.manifest.jsonl") == [["a.0", "a.1"]]
    assert _manifest_lines(tmp_path / "manifest.jsonl") == [["a.0", "a.1"]]
    a0, bad, a1, again, cancelled = answers
    assert isinstance(a0, RolloutSummary) and a0.durable and a0.reward == 1.0 and a0.status is RolloutStatus.COMPLETED
    assert bad == "ValueError: no tokens in turn 3"  # only its own answer fails
    assert a1.rollout_id == "a.1" and a1.reward == 0.0
    assert again == a0  # exactly once: the duplicate is answered with the first one's summary
    assert cancelled.durable is False
    # a later call: the durable one is answered as stored; the failed one was not kept and records now
    red._linearize = ReducerActor._linearize.__get__(red)
    later = await red.submit_many([make_result("a.0", reward=0.0), make_result("bad.0")])
    assert later[0] == a0 and later[1].rollout_id == "bad.0" and later[1].durable
    assert _manifest_lines(tmp_path / "rollouts.manifest.jsonl") == [["a.0", "a.1"], ["bad.0"]]
    assert await red.submit_many([]) == []
    await red.close()
    assert sorted(await ReducerActor(reducer_config(tmp_path), metrics=False).done_ids()) == ["a.0", "a.1", "bad.0"]


async def test_submit_many_a_failed_commit_is_each_rollouts_answer(tmp_path):
    red = ReducerActor(reducer_config(tmp_path), metrics=False)

    def commit(batch):
        raise OSError(28, "No space left on device")

    red.store.commit = commit
    answers = await red.submit_many([make_result("a.0"), make_result("a.1")])
    assert answers == ["OSError: [Errno 28] No space left on device"] * 2
    assert await red.done_ids() == []


# --- ReducerLink --------------------------------------------------------------------


class Recording:
    """The in-process reducer, its ``submit_many`` calls recorded (and, gated, held)."""

    def __init__(self, red: ReducerActor) -> None:
        self.red = red
        self.batches: list[list[str]] = []
        self.gate: asyncio.Event | None = None
        self.fail: BaseException | None = None

    async def submit_many(self, results):
        self.batches.append([r.rollout_id for r in results])
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return await self.red.submit_many(results)


@pytest.fixture
async def reducer(tmp_path):
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    yield Recording(red)
    await red.close()


async def test_link_batches_under_load(reducer, tmp_path):
    link = ReducerLink(reducer, max_batch=16)
    ids = [f"g{i // 8}.{i % 8}" for i in range(50)]
    got = await asyncio.gather(*(link.submit(make_result(rid, reward=float(i % 2))) for i, rid in enumerate(ids)))
    assert [s.rollout_id for s in got] == ids and all(s.durable for s in got)
    assert [s.reward for s in got] == [float(i % 2) for i in range(50)]
    sent = [rid for batch in reducer.batches for rid in batch]
    assert sorted(sent) == sorted(ids)  # each once
    assert link.calls == len(reducer.batches) < 50 and max(map(len, reducer.batches)) <= 16
    assert sorted(await reducer.red.done_ids()) == sorted(ids)


async def test_link_keeps_sending_while_calls_are_in_flight(reducer):
    """A result that finishes while a call waits for its commit goes in another call at
    once (up to max_in_flight), not after it."""
    link = ReducerLink(reducer, max_in_flight=2)
    reducer.gate = asyncio.Event()
    first = asyncio.ensure_future(link.submit(make_result("a.0")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    second = asyncio.ensure_future(link.submit(make_result("a.1")))
    third = asyncio.ensure_future(link.submit(make_result("a.2")))
    for _ in range(5):
        await asyncio.sleep(0)
    assert reducer.batches == [["a.0"], ["a.1", "a.2"]]  # two in flight; the third waits in the queue...
    fourth = asyncio.ensure_future(link.submit(make_result("a.3")))
    for _ in range(5):
        await asyncio.sleep(0)
    assert reducer.batches == [["a.0"], ["a.1", "a.2"]]  # ...no third call while two are in flight
    reducer.gate.set()
    got = await asyncio.gather(first, second, third, fourth)
    assert [s.rollout_id for s in got] == ["a.0", "a.1", "a.2", "a.3"]
    assert reducer.batches[2:] == [["a.3"]]


async def test_link_errors_stay_with_their_rollouts(reducer):
    _failing_linearize(reducer.red, "bad.0")
    link = ReducerLink(reducer)
    got = await asyncio.gather(*(link.submit(make_result(r)) for r in ("a.0", "bad.0", "a.1")), return_exceptions=True)
    assert len(reducer.batches) == 1
    assert got[0].rollout_id == "a.0" and got[2].rollout_id == "a.1"
    assert isinstance(got[1], RuntimeError)
    assert str(got[1]) == "the reducer could not record rollout bad.0: ValueError: no tokens in turn 3"
    # the call itself fails (the reducer died): every rollout of that call raises it
    reducer.fail = died = ConnectionError("the reducer died")
    got = await asyncio.gather(*(link.submit(make_result(r)) for r in ("b.0", "b.1")), return_exceptions=True)
    assert got == [died, died]
    reducer.fail = None
    assert (await link.submit(make_result("b.0"))).durable  # the link goes on


async def test_link_a_cancelled_submit_leaves_the_others(reducer):
    errors: list[dict] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: errors.append(ctx))
    link = ReducerLink(reducer, max_in_flight=1)
    reducer.gate = asyncio.Event()
    sent = [asyncio.ensure_future(link.submit(make_result(r))) for r in ("a.0", "a.1")]
    for _ in range(3):
        await asyncio.sleep(0)
    queued = [asyncio.ensure_future(link.submit(make_result(r))) for r in ("b.0", "b.1")]
    await asyncio.sleep(0)
    sent[1].cancel()  # in flight: its answer is dropped
    queued[0].cancel()  # not sent yet: left out of the next call
    reducer.gate.set()
    answered = await asyncio.wait_for(asyncio.gather(sent[0], queued[1]), 60)  # a hang: the link stopped sending
    assert [s.rollout_id for s in answered] == ["a.0", "b.1"]
    for task in (sent[1], queued[0]):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert reducer.batches == [["a.0", "a.1"], ["b.1"]]
    assert errors == []  # no InvalidStateError in a callback, no unretrieved exception


async def test_link_resolves_a_name_once(reducer, monkeypatch):
    looked_up: list[str] = []

    def resolve(name):
        looked_up.append(name)
        return reducer

    monkeypatch.setattr(reducer_link, "resolve", resolve)
    link = ReducerLink("farm-reducer", max_in_flight=1)
    for rid in ("a.0", "a.1", "a.2"):  # three calls, one after the other: each sender ends and frees its place
        await asyncio.wait_for(link.submit(make_result(rid)), 60)  # a hang here: no sender took it
    assert link.calls == 3 and looked_up == ["farm-reducer"]


# --- counters summed per commit ----------------------------------------------------


class Recorder:
    """Stands for a Ray metric object: records what it is given."""

    calls: list[tuple[str, str, float, tuple]] = []

    def __init__(self, spec):
        self.name = spec.name

    def _rec(self, how):
        def rec(value, tags):
            Recorder.calls.append((how, self.name, value, tuple(sorted(tags.items()))))
        return rec

    def __getattr__(self, how):
        return self._rec(how)


def _results():
    from farm.output.rows import counts_of
    from farm.trajectory.tree import TurnTree

    out = []
    for i in range(12):
        status = [RolloutStatus.COMPLETED, RolloutStatus.SANDBOX_ERROR, RolloutStatus.TIMEOUT][i % 3]
        r = make_result(f"g{i // 4}.{i % 4}", status=status, reward=[1.0, 0.5, 0.0, 0.25][i % 4])
        r.attempt = 1 + i % 2
        r.finished_at = r.started_at + 0.5 * (i + 1)  # durations exact in binary: the sums compare exactly
        if i % 5 == 0:  # a turn the gateway flagged
            tree = TurnTree(r.rollout_id)
            tree.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-0.1],
                        finish_reason="stop", timings={"engine_ms": 30.0}, flags=["tool_parse_error"])
            r = r.model_copy(update={"tree": tree, "counts": counts_of(tree)})
        out.append(r)
    return out


def _sums(calls):
    sums: dict[tuple, float] = defaultdict(float)
    for how, name, value, tags in calls:
        if how == "inc":
            sums[(name, tags)] += value
    return dict(sums)


def test_summed_counters_export_what_per_rollout_counters_did(monkeypatch):
    monkeypatch.setattr(metrics, "_make", Recorder)
    monkeypatch.setattr(Recorder, "calls", [])
    per_rollout = metrics.ActorMetrics("r1", gauge_refresh_s=None)
    for r in _results():
        per_rollout.observe_rollout(r)
    before, Recorder.calls = Recorder.calls, []
    summed = metrics.ActorMetrics("r1", gauge_refresh_s=None, sum_counters=True)
    for r in _results():
        summed.observe_rollout(r)
    assert [c for c in Recorder.calls if c[0] == "inc"] == []  # nothing reaches Ray before the flush
    summed.flush_counters()
    summed.flush_counters()  # nothing twice
    incs = [c for c in Recorder.calls if c[0] == "inc"]
    assert _sums(incs) == _sums(before)
    assert len(incs) == len(_sums(before)) < len([c for c in before if c[0] == "inc"]) / 5  # one inc per series
    # histograms are still observed per rollout, as before
    assert [c for c in Recorder.calls if c[0] != "inc"] == [c for c in before if c[0] != "inc"]


async def test_reducer_gives_its_counters_to_ray_at_each_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "_make", Recorder)
    monkeypatch.setattr(Recorder, "calls", [])
    red = ReducerActor(reducer_config(tmp_path))
    await red.submit_many([make_result("a.0"), make_result("a.1", reward=0.0)])
    rollouts = {tags: v for how, name, v, tags in Recorder.calls if how == "inc" and name == "farm_rollouts"}
    assert list(rollouts.values()) == [2]  # once the commit is done: both, in one increment
    await red.close()


async def test_a_commit_larger_than_the_summary_cache_answers_from_the_batch(tmp_path, monkeypatch):
    """Each waiting submit is answered with the summary its commit stored, not looked up in
    the store (which keeps the last N in memory and reads older ones back from their shard:
    one shard read a rollout when a commit outgrows N)."""
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    red.store.summaries._cache = 4  # a commit of 16 outgrows it

    def no_read(rollout_id):
        raise AssertionError(f"{rollout_id} read back from its shard")

    monkeypatch.setattr(red.store.summaries, "_read", no_read)
    results = [make_result(f"g{i // 4}.{i % 4}", reward=i / 16) for i in range(16)]
    answers = await asyncio.gather(red.submit_many(results[:8]), *(red.submit(r) for r in results[8:]))
    got = [*answers[0], *answers[1:]]
    assert [(a.rollout_id, a.reward, a.durable) for a in got] == [(r.rollout_id, r.reward, True) for r in results]
    assert _manifest_lines(tmp_path / "rollouts.manifest.jsonl") == [[r.rollout_id for r in results]]


async def test_a_full_buffer_asks_for_one_flush_at_a_time(tmp_path):
    """Rollouts admitted past ``shard_max_rows`` while a commit runs ask for one flush, not
    one each: a flush task per rollout queued on the commit lock (thousands under load,
    the reducer's memory climbing with them)."""
    red = ReducerActor(reducer_config(tmp_path, shard_max_rows=4), metrics=False)
    real_commit, real_flush = red.store.commit, red.flush
    alive = peak = 0

    def slow_commit(batch):  # in the flush's thread: admits go on meanwhile
        import time

        time.sleep(0.05)  # the slow commit under test
        return real_commit(batch)

    async def flush():
        nonlocal alive, peak
        alive += 1
        peak = max(peak, alive)
        try:
            return await real_flush()
        finally:
            alive -= 1

    red.store.commit, red.flush = slow_commit, flush
    calls = []
    for k in range(8):  # a call every 20 ms, 16 rollouts each: a commit is always running
        calls.append(asyncio.ensure_future(red.submit_many([make_result(f"g{k}x{i // 4}.{i % 4}") for i in range(16)])))
        await asyncio.sleep(0.02)  # the calls' pace under test: a commit is always running
    answers = [a for got in await asyncio.gather(*calls) for a in got]
    assert len(answers) == 128 and all(isinstance(a, RolloutSummary) and a.durable for a in answers)
    assert sum(len(ids) for ids in _manifest_lines(tmp_path / "rollouts.manifest.jsonl")) == 128
    assert peak <= 3, peak  # the full buffer's one, the flush loop's, and one committing
    await red.close()
