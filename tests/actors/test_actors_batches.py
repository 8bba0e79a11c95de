"""Rollouts sent in batches (farm.actors.batches, SandboxActor.run_many): what is out is kept
per rollout, and a batch's answers stream back as each rollout ends."""

from __future__ import annotations

import asyncio

import pytest

from farm.actors.batches import CANCELLED, InFlight, Sent
from farm.actors.sandbox import SandboxActor
from farm.config import FarmConfig
from farm.tasks.model import Task
from farm.rollout.model import RolloutSpec


def _spec(rid: str) -> RolloutSpec:
    return RolloutSpec(run_id="r", rollout_id=rid, group_id=rid.split(".")[0], task=Task(id="t", instruction="x"),
                       sample_index=int(rid.split(".")[1]))  # fmt: skip


def test_inflight_keeps_each_rollout_and_what_each_batch_has_left():
    out = InFlight()
    a, b = object(), object()
    out.sent(a, [Sent(_spec("g.0"), "actor-0", 1.0), Sent(_spec("g.1"), "actor-0", 1.0)])
    out.sent(b, [Sent(_spec("h.0"), "actor-1", 2.0)])
    assert len(out) == 3 and out and set(out.batches) == {a, b}
    item = out.back("g.1")
    assert item is not None and item.batch is a and item.actor == "actor-0"
    assert out.back("g.1") is None  # answered twice (the guard ended it first): once
    assert out.started(a) == 1.0 and out.started(b) == 2.0 and not out.empty(a)
    assert [i.spec.rollout_id for i in out.drop(b)] == ["h.0"]  # its stream ended: what it had left
    assert b not in out.batches and len(out) == 1
    out.back("g.0")
    assert out.empty(a) and not out and out.started(a) is None
    assert out.drop(a) == [] and out.batches == []


class _Actor(SandboxActor):
    """A sandbox actor whose ``run`` waits for the test to release each rollout."""

    def __init__(self) -> None:
        super().__init__(FarmConfig(), "http://engine", reducer=None)
        self.release: dict[str, asyncio.Future[str]] = {}
        self.cleaned: list[str] = []

    async def run(self, spec: RolloutSpec):  # type: ignore[override]
        fut = self.release.setdefault(spec.rollout_id, asyncio.get_running_loop().create_future())
        try:
            outcome = await fut
        finally:
            self.cleaned.append(spec.rollout_id)
        if outcome == "raise":
            raise ValueError(f"bug in run for {spec.rollout_id}")
        return spec.interrupted("a")  # any RolloutSummary


async def _until(cond) -> None:
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0.005)  # poll: 200 tries bound the wait
    raise AssertionError("condition not reached")


def test_run_many_streams_each_answer_as_its_rollout_ends():
    async def go():
        actor = _Actor()
        ids = ["g.0", "g.1", "g.2", "g.3"]
        stream = actor.run_many([_spec(r) for r in ids])
        first = asyncio.ensure_future(stream.__anext__())
        await _until(lambda: len(actor.release) == 4)
        actor.release["g.2"].set_result("ok")
        actor.release["g.0"].set_result("ok")  # two end together: one message
        msg = await first
        assert sorted(a.rollout_id for a in msg) == ["g.0", "g.2"] and all(a.summary is not None for a in msg)
        assert await actor.abort("g.1")  # the dispatcher aborts one (stale): answered cancelled
        msg = await stream.__anext__()
        assert [(a.rollout_id, a.error, a.summary) for a in msg] == [("g.1", CANCELLED, None)]
        actor.release["g.3"].set_result("raise")  # a bug in run: that rollout's answer says so
        msg = await stream.__anext__()
        assert msg[0].rollout_id == "g.3" and msg[0].summary is None
        assert msg[0].error == "ValueError: bug in run for g.3"
        with pytest.raises(StopAsyncIteration):  # every rollout answered: the stream ends
            await stream.__anext__()
        assert not actor._running

    asyncio.run(go())


def test_cancelling_run_many_cancels_what_runs_and_waits_for_its_cleanup():
    async def go():
        actor = _Actor()
        stream = actor.run_many([_spec("g.0"), _spec("g.1")])
        task = asyncio.ensure_future(stream.__anext__())
        await _until(lambda: len(actor.release) == 2)
        task.cancel()  # what Ray's cancel of the call does
        with pytest.raises(asyncio.CancelledError):
            await task
        await stream.aclose()
        assert sorted(actor.cleaned) == ["g.0", "g.1"] and not actor._running

    asyncio.run(go())
