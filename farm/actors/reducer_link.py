"""ReducerLink: a sandbox actor's one way to the reducer; the rollouts that finish together
go as one ``ReducerActor.submit_many`` call.

One Ray call per finished rollout cost the sandbox actor about a third of its CPU (the
call, the pickling of one result) and the reducer most of its own (one task's overhead
and deserialization per rollout) at ~150 rollouts/s. Here ``submit(result)`` queues the
result and waits for its answer; up to ``MAX_IN_FLIGHT`` senders each take whatever is
queued (at most ``MAX_BATCH``) and send it as one call. No timer: an idle link sends a
lone result at once, and under load the results that finish while the senders are busy
go together in the next call.

Errors stay where they belong: a call that fails (the reducer died: ``RayActorError``)
raises that exception in every ``submit`` of its batch, as the single call did; a
rollout the reducer could not record (its answer an error string) raises a RuntimeError
in that rollout's ``submit`` only. A ``submit`` that is cancelled (``ray.cancel`` of a
``run``) takes nothing down with it: not sent yet, it is left out of the call; already
sent, its answer is dropped.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from farm.actors.calls import call, resolve
from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutResult

# Calls in flight at once. The reducer answers a call only once its rollouts are durable
# (its group commit runs every ``ray.reducer_flush_s``): with one call in flight a result
# finishing just after a send would wait out that commit before even leaving, then its
# own. A few senders let each batch go at once; few, so a burst goes as a few big calls
# rather than many small ones (each call costs a Ray task on both sides).
MAX_IN_FLIGHT = 4
# Results per call at most: bounds one call's payload (a result carries its token tree,
# tens of KB on a long rollout) and the reducer's work per task.
MAX_BATCH = 256


class ReducerLink:
    """Submits finished rollouts to ``reducer`` (a Ray actor's name or handle, or a plain
    object with ``submit_many``, in-process). Use it from one event loop."""

    def __init__(self, reducer: Any, *, max_in_flight: int = MAX_IN_FLIGHT, max_batch: int = MAX_BATCH) -> None:
        self._target = reducer
        self._reducer: Any = None  # resolved on the first call: ray.get_actor blocks, so once
        self._queue: deque[tuple[RolloutResult, asyncio.Future[RolloutSummary]]] = deque()
        self._senders: set[asyncio.Task[None]] = set()  # references: the loop keeps only weak ones
        self._sending = 0  # senders running (counted here, not by the set: a done task leaves it a step late)
        self.max_in_flight = max_in_flight
        self.max_batch = max_batch
        self.calls = 0  # submit_many calls made (how much batching there was: submits / calls)

    async def submit(self, result: RolloutResult) -> RolloutSummary:
        """Hand ``result`` to the reducer; returns its summary once it is durable (see
        ``ReducerActor.submit``)."""
        fut: asyncio.Future[RolloutSummary] = asyncio.get_running_loop().create_future()
        self._queue.append((result, fut))
        if self._sending < self.max_in_flight:
            self._sending += 1
            task = asyncio.get_running_loop().create_task(self._send())
            self._senders.add(task)
            task.add_done_callback(self._senders.discard)
        return await fut  # cancelled: the future is cancelled with it, and skipped below

    def _take(self) -> list[tuple[RolloutResult, asyncio.Future[RolloutSummary]]]:
        batch = []
        while self._queue and len(batch) < self.max_batch:
            entry = self._queue.popleft()
            if not entry[1].done():  # its submit was cancelled before it went: not sent
                batch.append(entry)
        return batch

    async def _send(self) -> None:
        """Send what is queued, batch after batch, until nothing is."""
        try:
            while batch := self._take():
                await self._send_batch(batch)
        finally:  # in the step that found the queue empty: a submit after it starts a sender
            self._sending -= 1

    async def _send_batch(self, batch: list[tuple[RolloutResult, asyncio.Future[RolloutSummary]]]) -> None:
        try:
            if self._reducer is None:
                self._reducer = resolve(self._target)
            self.calls += 1
            answers = await call(self._reducer, "submit_many", [result for result, _ in batch])
            if len(answers) != len(batch):
                raise RuntimeError(f"the reducer answered {len(answers)} of {len(batch)} rollouts submitted")
        except asyncio.CancelledError:  # this sender was cancelled (its loop closing): its waiters with it
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:  # the call failed: every rollout in it fails as its own call would have
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        for (result, fut), answer in zip(batch, answers):
            if fut.done():  # cancelled while in flight: nobody waits for its answer
                continue
            if isinstance(answer, str):
                fut.set_exception(RuntimeError(f"the reducer could not record rollout {result.rollout_id}: {answer}"))
            else:
                fut.set_result(answer)
