"""One rollout started through ``farm.Rollouts``: its live state, its event log, its end.

The rollout itself runs in the farm's own pipeline (``SandboxActor.execute``); the
handle only listens (phase changes from the pipeline, turns from the gateway session)
and keeps what it heard as an append-only event log that any number of readers follow
(``events()`` replays from the start, then waits for more). Events are numbered from 1
(``seq``); a reader resumes with the seq of the last event it has (``since=N``: the
events after N; 0: all of them), as SSE's ``Last-Event-ID`` does. Event kinds::

    queued · phase {phase} · turn_started {turn, prompt_tokens} ·
    turn_finished {turn, prompt_tokens, output_tokens, finish_reason, tool_calls} ·
    tool_call {name, arguments} · agent_output {line} · result {status, reward, ...}

``abort()`` cancels it: the pipeline closes its session and sandbox on the way out and
the rollout ends ``aborted`` (an infrastructure status: never trainable, never stored).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from farm.rollout.model import RolloutResult, RolloutSpec, Runner
from farm.rollout.outcome import Ending, outcome_for_ending
from farm.status import Outcome, RolloutStatus
from farm.trajectory.transcript import main_line_messages


@dataclass(frozen=True)
class RolloutEvent:
    seq: int
    kind: str
    time: float
    data: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "time": round(self.time, 3), **self.data}


class RolloutHandle:
    """A rollout in flight (or finished): state, events, messages, abort, result, finalize."""

    def __init__(self, spec: RolloutSpec, runner: Runner, *,
                 live_transcript: Callable[[], Awaitable[list[dict[str, Any]]]],
                 store: Callable[[RolloutResult], Awaitable[Any]], outputs: dict[str, str],
                 remote_abort: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.spec = spec
        self.id = spec.rollout_id
        self.runner = runner
        self.harness = runner.harness
        self._live_transcript = live_transcript
        self._remote_abort = remote_abort  # the rollout runs elsewhere (Ray): ask its actor
        self._store = store
        self._outputs = outputs
        self._events: list[RolloutEvent] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[RolloutResult] | None = None
        self._result: RolloutResult | None = None
        self._result_seq: int | None = None  # the seq of the ``result`` event, once emitted
        self._aborting = False
        self._finalized: dict[str, Any] | None = None
        self._finalize_lock = asyncio.Lock()
        self._done = asyncio.Event()
        self.phase = "queued"
        self.turns = 0
        self.context_tokens = 0  # the last turn's whole prompt
        self.prompt_tokens = 0  # prompt tokens the engine took in (each turn's new ones), as the result counts them
        self.output_tokens = 0
        self.started = time.time()
        self._t0 = time.monotonic()
        self._ended_at: float | None = None
        self.emit("queued", {"task_id": spec.task.id, "harness": runner.harness})

    # --- what the farm tells it ------------------------------------------------------
    def attach(self, task: asyncio.Task[RolloutResult]) -> None:
        self._task = task
        task.add_done_callback(self._ended)

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self._events.append(RolloutEvent(len(self._events) + 1, kind, time.time(), data))  # seq n at index n - 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def observe(self, kind: str, data: dict[str, Any]) -> None:
        """The pipeline's / gateway session's observer (same event loop)."""
        if kind == "phase":
            self.phase = data["phase"]
            self.emit("phase", data)
        elif kind == "turn_started" and not data.get("side"):
            self.emit("turn_started", {"turn": self.turns + 1, "prompt_tokens": data["prompt_tokens"]})
        elif kind == "turn_finished" and not data.get("side"):
            self.turns += 1
            self.context_tokens = int(data["prompt_tokens"])
            self.prompt_tokens += int(data.get("new_prompt_tokens", 0))
            self.output_tokens += int(data["output_tokens"])
            calls = data.get("tool_calls") or []
            self.emit("turn_finished", {
                "turn": self.turns, "prompt_tokens": self.context_tokens, "output_tokens": int(data["output_tokens"]),
                "finish_reason": data.get("finish_reason"), "tool_calls": [c["function"]["name"] for c in calls],
            })  # fmt: skip
            for call in calls:
                self.emit("tool_call", {"turn": self.turns, "name": call["function"]["name"],
                                        "arguments": call["function"].get("arguments")})  # fmt: skip
        elif kind == "agent_output":
            self.emit("agent_output", data)

    def _ended(self, task: asyncio.Task[RolloutResult]) -> None:
        self._ended_at = time.monotonic()
        try:
            result = self._final(task)
        except Exception as exc:  # noqa: BLE001 - a handle must end, whatever happened
            result = self._ended_without_pipeline(outcome_for_ending(Ending.ACTOR_FAILED, f"internal error: {exc!r}"))
        self._result = result
        self.phase = "done"
        self._done.set()
        self.emit("result", self.summary())
        self._result_seq = len(self._events)

    def _final(self, task: asyncio.Task[RolloutResult]) -> RolloutResult:
        result: RolloutResult | None = None
        if task.cancelled():  # cancelled before the pipeline ran (queued): nothing was created
            pass
        elif task.exception() is not None:  # the pipeline never raises: the actor around it failed
            exc = task.exception()
            return self._ended_without_pipeline(outcome_for_ending(
                Ending.ACTOR_FAILED, f"the sandbox actor failed: {type(exc).__name__}: {exc}"))
        else:
            result = task.result()
        if result is None or (self._aborting and result.status is RolloutStatus.CANCELLED):
            return self._aborted(result)
        if self._aborting and not result.status.trainable:
            return result.ended_as(outcome_for_ending(Ending.ABORTED, f"aborted by the caller ({result.reason})"))
        return result

    def _aborted(self, result: RolloutResult | None) -> RolloutResult:
        where = result.reason.removeprefix("cancelled ") if result is not None else "while queued"
        reason = f"aborted by the caller {where}"
        if result is not None:
            return result.ended_as(outcome_for_ending(Ending.ABORTED, reason), reward=0.0)
        return self._ended_without_pipeline(outcome_for_ending(Ending.ABORTED, reason))

    def _ended_without_pipeline(self, outcome: Outcome) -> RolloutResult:
        return RolloutResult.of(self.spec, self.runner, outcome, started_at=self.started)

    # --- what a caller asks --------------------------------------------------------------
    @property
    def done(self) -> bool:
        """The rollout has ended (any status); its result is there."""
        return self._result is not None

    @property
    def stored(self) -> bool:
        """Finalized, and its row (and Samples) durable in the output directory."""
        return bool(self._finalized and self._finalized["stored"])

    def result_summary(self) -> Any:
        """The finished rollout's ``RolloutSummary`` (what the run summary counts), or None."""
        return self._result.summary() if self._result is not None else None

    def state(self) -> dict[str, Any]:
        """Now: id, task, harness, status (``running`` until it ends), phase (``queued``,
        ``create_sandbox``, ``prepare``, ``agent``, ``grade``, ...), turns, tokens, elapsed seconds, finalized."""
        end = self._ended_at if self._ended_at is not None else time.monotonic()
        return {
            "id": self.id, "task_id": self.spec.task.id, "harness": self.harness,
            "status": self._result.status.value if self._result is not None else "running",
            "phase": self.phase, "turns": self.turns,
            "tokens": {"prompt": self.prompt_tokens, "output": self.output_tokens, "context": self.context_tokens},
            "elapsed_s": round(end - self._t0, 3), "finalized": self._finalized is not None,
        }  # fmt: skip

    async def events(self, since: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Every event after seq ``since`` (the last one the reader has; 0: from the
        start), live, until (and including) the final ``result``."""
        i = max(0, since)  # the index of seq since + 1
        while True:
            changed = self._changed
            while i < len(self._events):
                ev = self._events[i]
                i += 1
                yield ev.as_dict()
                if ev.kind == "result":
                    return
            if self._result_seq is not None and i >= self._result_seq:
                return  # the reader has the result already: nothing more comes
            await changed.wait()

    async def poll(self, since: int = 0, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """The events after seq ``since`` that are there now; when there are none yet (and
        the rollout has not ended), waits up to ``wait_s`` for the first (long poll)."""
        if since >= len(self._events) and wait_s > 0 and self._result is None:
            try:
                await asyncio.wait_for(self._changed.wait(), wait_s)
            except TimeoutError:
                pass
        return [ev.as_dict() for ev in self._events[max(0, since):]]

    async def messages(self) -> list[dict[str, Any]]:
        """The canonical transcript so far (from the live session, or the finished tree)."""
        if self._result is not None:
            return main_line_messages(self._result.tree)
        return await self._live_transcript()

    async def abort(self) -> dict[str, Any]:
        """End the rollout now: status ``aborted``, its sandbox closed, nothing stored.
        A rollout that already ended keeps its status."""
        if self._task is not None and not self._task.done():
            self._aborting = True
            if self._remote_abort is None:
                self._task.cancel()
            else:  # until its actor has it (the call may overtake the rollout's start there)
                while not self._task.done() and not await self._remote_abort():
                    await asyncio.wait({self._task}, timeout=0.2)
        await self.wait()
        return self.summary()

    async def wait(self) -> RolloutResult:
        """Wait for the end; the ``RolloutResult`` (as ``result()``)."""
        await self._done.wait()  # set by the task's done callback
        assert self._result is not None
        return self._result

    async def result(self) -> RolloutResult:
        """The finished rollout (reward, grading report, diff, transcript tree); stores nothing."""
        return await self.wait()

    async def finalize(self, *, keep_aborted: bool = False) -> dict[str, Any]:
        """Wait for the end, write its Samples and rollouts row (once), return the summary
        with the output paths. An aborted rollout writes nothing unless ``keep_aborted``:
        then its row (and Samples, marked untrainable like any infrastructure status)."""
        result = await self.wait()
        async with self._finalize_lock:
            if self._finalized is None:
                stored = None
                if result.status is not RolloutStatus.ABORTED or keep_aborted:
                    stored = await self._store(result)
                self._finalized = {"stored": stored is not None and bool(getattr(stored, "durable", False))}
                self.emit("finalized", dict(self._finalized))
        return {**self.summary(), **self._finalized, "outputs": self._outputs if self._finalized["stored"] else {}}

    def summary(self) -> dict[str, Any]:
        """The ended rollout as JSON-able fields (id, status, reason, reward, turns, tokens,
        duration, diff, grading, ...); while it runs, its ``state()``."""
        r = self._result
        if r is None:
            return self.state()
        return {
            "id": r.rollout_id, "task_id": r.task_id, "harness": r.harness, "status": r.status.value,
            "reason": r.reason, "reward": r.reward, "trainable": r.status.trainable, "turns": r.counts.turns,
            "tokens": {"prompt": r.counts.prompt_tokens, "output": r.counts.output_tokens},
            "duration_s": round(r.duration_s, 3), "sandbox_id": r.sandbox_id, "diff": r.diff, "grading": r.grading,
        }  # fmt: skip
