"""ReducerActor: turns finished rollouts into durable rows, exactly once per rollout id.

A plain class (made a Ray actor by the driver: ``max_restarts=-1,
max_task_retries=-1``; every method is idempotent). Every attempt of every rollout ends
here, and here only is it decided what becomes of it (``farm.rollout.retry.decide``):
recorded, run again (handed back to the dispatcher, not stored), or dropped (the run is
stopping: the next invocation runs it). A sandbox actor submits each rollout that finished;
the dispatcher submits the attempts it saw end around the pipeline (``RolloutResult.ending``:
an actor lost, hung, aborted as stale, an actor's bug, given up). For each RolloutResult
recorded it linearizes the session tree into Samples (a black-box rollout's transcript goes to
the ``transcripts`` table instead: never Samples) and buffers them plus one
rollouts-table row; a group commit (every ``ray.reducer_flush_s``, or when a shard's
worth of rows is buffered) makes them durable: Sample shard + ``manifest.jsonl``
first, then the rollouts shard + its manifest. ``submit`` returns only after its
rollout is durable; a rollout already durable (a retry, a re-dispatch, a restarted
reducer) is acknowledged without writing anything.

On start it resumes from the manifests. A crash between the two commits leaves
Samples whose rollouts have no row: those rows are rebuilt from the Samples (status,
reward and counts are in them; the diff and logs are not) so the two tables agree.
Cancelled rollouts are never stored: a rerun runs them.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import time
from pathlib import Path
from typing import Any

from farm.config import FarmConfig
from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutResult
from farm.rollout.outcome import Ending, outcome_for_ending, writes_samples
from farm.rollout.retry import RetryBudgets, decide
from farm.output.writer import OutputWriter
from farm.output.rows import counts_of
from farm.trajectory.linearize import RolloutInfo, linearize
from farm.status import RolloutStatus, Verdict

log = logging.getLogger(__name__)


def _compact(report: dict[str, Any] | None) -> dict[str, Any]:
    """The scalar facts of a grading report (what Sample metadata carries; the full report
    is in the rollouts table)."""
    if not report:
        return {}
    return {
        k: v
        for k, v in report.items()
        if isinstance(v, (bool, int, float)) or v is None or (isinstance(v, str) and len(v) <= 200)
    }


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def steady_malloc() -> bool:
    """Keep this process's freed memory for reuse: allocations up to 32 MiB from the heap,
    the heap trimmed only past 1 GiB free. The reducer concatenates ~1M-token sessions into
    fresh arrays: with glibc's default thresholds every such call returns its memory to the
    kernel and page-faults it back (400-turn linearize 6x slower than 100-turn instead of
    4x: scripts/bench_trajectory.py). Set in the process (``mallopt``, what the
    ``MALLOC_*_`` variables set at start-up): a Ray actor with environment variables of its
    own gets a worker started for it (~1.4 s of every run's start) instead of a pooled one.
    False where there is no glibc (nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 30))


class ReducerActor:
    def __init__(self, cfg: FarmConfig, *, metrics: bool = True, steady_memory: bool = False) -> None:
        if steady_memory and not steady_malloc():  # its own process (a Ray actor)
            log.info("reducer: no glibc mallopt here: the allocator keeps its default thresholds")
        self.cfg = cfg
        self.budgets = RetryBudgets.from_config(cfg)
        self.out_dir = Path(cfg.output.dir)
        self.store = OutputWriter(self.out_dir, cfg.output)
        self.store.recover()
        self.store.reconcile()
        for line in self.store.recovery_lines():
            log.warning("reducer: %s", line)
        # rollout id -> the future of the commit that makes it durable: its stored summary
        self._pending: dict[str, asyncio.Future[RolloutSummary]] = {}
        self._lock: asyncio.Lock | None = None
        self._flusher: asyncio.Task[None] | None = None
        # the flush a full buffer asked for: one at a time (one per rollout admitted past the
        # threshold queued a task per rollout on the lock while a commit ran: thousands
        # under load, each a commit of what came in during the one before it)
        self._eager: asyncio.Task[int] | None = None
        self._closed = False
        self.policy_version = 0  # the farm's current weight version (farm.Farm.update_weights sets it)
        self.stale_dropped = 0
        self._stopping = False  # the run is stopping (the dispatcher says so): what ends now is not run again
        self._metrics = None
        if metrics:  # Ray's metrics API: only where the reducer exports metrics
            from farm.actors.metrics import ActorMetrics

            self._metrics = ActorMetrics(cfg.run_id, sum_counters=True)  # flushed after each commit
            self._metrics.set_policy_version(self.policy_version)

    # --- queries (idempotent) -----------------------------------------------
    async def ready(self) -> bool:
        return True

    async def done_ids(self) -> list[str]:
        """Rollout ids already durable in the output directory, in no order (a resume makes
        a set of them; sorting a million took ~0.6 s of the reducer's open)."""
        return list(self.store.summaries)

    async def recovery(self) -> list[str]:
        """What opening the output directory repaired (one line per change; empty: nothing)."""
        return self.store.recovery_lines()

    async def lookup(self, rollout_id: str) -> RolloutSummary | None:
        """The stored summary of a durable rollout, or None."""
        return self.store.summaries.get(rollout_id)

    async def stats(self) -> dict[str, Any]:
        return {"durable": len(self.store.summaries), "pending": len(self._pending), "stale_dropped": self.stale_dropped,
                "policy_version": self.policy_version, **self.store.stats()}

    async def set_policy_version(self, version: int) -> int:
        """The weights every later turn is generated with (staleness is measured against it)."""
        self.policy_version = max(self.policy_version, int(version))
        if self._metrics is not None:
            self._metrics.set_policy_version(self.policy_version)
        return self.policy_version

    async def stop_accepting(self) -> None:
        """The run is stopping: an attempt that ends from now on (but one finished completed
        or truncated) is dropped, not recorded nor run again: the next invocation runs it
        (``farm.rollout.retry.decide``). The dispatcher says so before it cancels the
        rollouts in flight, so one that ends because it was cancelled, its sandbox closed or
        its CLI killed under it is never recorded as a failure."""
        self._stopping = True

    def _stale(self, result: RolloutResult) -> str | None:
        """Why ``result`` is too stale to keep (stream.on_stale = drop), or None."""
        oldest = result.counts.policy_version_min  # filled from the tree by ``submit``
        if not result.status.trainable or not self.cfg.stream.too_stale(oldest, self.policy_version, "recorded"):
            return None
        return (f"began under weight version {oldest}, recorded under {self.policy_version}: "
                f"staleness {self.policy_version - oldest} > stream.max_staleness {self.cfg.stream.max_staleness}")

    # --- writes -------------------------------------------------------------
    async def submit(self, result: RolloutResult) -> RolloutSummary:
        """Decide what becomes of ``result``'s attempt and, when it is recorded, make it durable
        (once per rollout id); returns the stored summary, or the summary handed back to the
        dispatcher (not durable) carrying the decision: run again, or dropped.

        A second submit of the same rollout id returns the first one's summary."""
        admitted = self._admit(result)
        if isinstance(admitted, RolloutSummary):
            return admitted
        return await asyncio.shield(admitted)

    async def submit_many(self, results: list[RolloutResult]) -> list[RolloutSummary | str]:
        """``submit`` for each of ``results`` (one call from a sandbox actor's
        ``farm.actors.reducer_link.ReducerLink``), all awaited together: the ones buffered
        together become durable in one commit. Returns once every one is durable (or failed).

        The answers are positional, one per result: its summary, or, when that rollout could
        not be recorded (its linearization raised, its commit failed), the error as a string
        ``"Type: message"``. Per result, so one bad rollout fails only its own ``run``, not the
        batch it came in; a string, because an exception object need not pickle back (a
        class with required constructor arguments, or from a module the caller lacks), and
        one answer that does not unpickle would fail the whole call."""
        answers: list[RolloutSummary | str | asyncio.Future[RolloutSummary]] = []
        for result in results:
            try:
                answers.append(self._admit(result))
            except Exception as exc:  # this rollout only (a BaseException is the whole call's)
                answers.append(_error(exc))
        waiting = {a for a in answers if isinstance(a, asyncio.Future)}
        if waiting:
            await asyncio.wait(waiting)  # unlike gather, leaves the commit's futures alone if cancelled
        out: list[RolloutSummary | str] = []
        for answer in answers:
            if isinstance(answer, asyncio.Future):
                exc = answer.exception()
                answer = _error(exc) if exc is not None else answer.result()
            out.append(answer)
        return out

    def _admit(self, result: RolloutResult) -> RolloutSummary | asyncio.Future[RolloutSummary]:
        """``submit`` up to the wait: the answer now (already durable; not stored: it runs
        again or is dropped), or the future of the commit that makes it durable (buffered now,
        or by an earlier submit of the same id). Raises what buffering it raised."""
        rid = result.rollout_id
        stored = self.store.summaries.get(rid)
        if stored is not None:
            return stored
        fut = self._pending.get(rid)
        if fut is not None:  # an earlier attempt is being recorded (its actor died waiting for the commit)
            return fut
        if result.tree is not None and result.counts.policy_version_min is None:  # the row's version columns
            c = counts_of(result.tree)
            result.counts = result.counts.model_copy(
                update={"policy_version_min": c.policy_version_min, "policy_version_max": c.policy_version_max})
        ended = self._decide(result)
        if isinstance(ended, RolloutSummary):
            return ended
        result = ended
        result.policy_version_at_finish = self.policy_version
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            trains = writes_samples(result.status, writes_tokens=result.mode.writes_samples,
                                    hack_action=result.hack_action,
                                    on_truncated=self.cfg.rollout.on_truncated)  # fmt: skip
            samples = self._linearize(result) if trains else []
            self.store.add(result, samples)
        except BaseException as exc:
            self._pending.pop(rid, None)
            fut.set_exception(exc)
            fut.exception()  # mark retrieved
            raise
        if self._metrics is not None:
            self._metrics.observe_rollout(result)
        self._ensure_flusher()
        full = self.store.buffered_rows >= self.cfg.output.shard_max_rows
        if full and (self._eager is None or self._eager.done()):
            self._eager = asyncio.get_running_loop().create_task(self.flush())
        return fut

    def _decide(self, result: RolloutResult) -> RolloutResult | RolloutSummary:
        """The one retry decision of an attempt's end (``farm.rollout.retry.decide``): the
        result to record (as its ending makes it once its budget is spent), or its summary
        handed back to the dispatcher, not stored, carrying the decision (run again, drop)."""
        stale = self._stale(result)
        ending = Ending.TOO_STALE if stale is not None else result.ending
        if stale is not None:
            self.stale_dropped += 1
        decision = decide(result.status, result.reruns, self.budgets, ending=ending, stopping=self._stopping,
                          deterministic=result.deterministic)  # fmt: skip
        if decision.verdict is Verdict.DROP:  # stopped under it (cancelled, its sandbox closed, its CLI killed)
            why = f"the run was stopped while it ran ({result.status.value}: {result.reason[:200]}); it runs again"
            return result.summary().handed_back(decision, status=decision.status, reason=why)
        if decision.runs_again:
            if stale is None:
                return result.summary().handed_back(decision)
            dropped = outcome_for_ending(Ending.TOO_STALE, stale)  # run again under the current weights
            return result.summary().handed_back(decision, status=dropped.status, reason=dropped.reason)
        if decision.status is None:  # recorded as it ended
            return result
        # its budget is spent: recorded as its ending makes it (too stale: no Samples, its group incomplete)
        return result.ended_as(outcome_for_ending(ending, f"{decision.reason} (last: {stale or result.reason})"))

    def _linearize(self, result: RolloutResult) -> list[Any]:
        if result.tree is None or len(result.tree) == 0:
            return []
        if not result.counts.turns:
            result.counts = counts_of(result.tree)
        info = RolloutInfo(
            rollout_id=result.rollout_id,
            run_id=result.run_id,
            task_id=result.task_id,
            group_id=result.group_id,
            sample_index=result.sample_index,
            group_index=result.group_index,
            harness=result.harness,
            model=result.model,
            status=result.status.value,
            reward=result.reward,
            metadata={
                "reason": result.reason,
                "attempt": result.attempt,
                "rollout_reward": result.reward,
                "rollout_turns": result.counts.turns,
                "grading": result.grading_summary if result.grading_summary is not None else _compact(result.grading),
                "sandbox": result.sandbox_policy,
                "policy_version_at_finish": result.policy_version_at_finish,
                **_truncation(result),
            },
        )
        return linearize(
            result.tree,
            info,
            reward_policy=self.cfg.output.reward_policy,
            keep_untrained=self.cfg.output.keep_untrained_chains,
        )

    def _ensure_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while self._pending and not self._closed:
            await asyncio.sleep(self.cfg.ray.reducer_flush_s)
            await self.flush()

    async def flush(self) -> int:
        """Make every buffered rollout durable and acknowledge it. Returns how many."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            batch = self.store.take_buffer()
            if not batch.rollout_ids:
                return 0
            t0 = time.monotonic()
            try:
                shards = await asyncio.to_thread(self.store.commit, batch)
            except BaseException as exc:
                if self._metrics is not None:  # counted when buffered, as before, durable or not
                    self._metrics.flush_counters()
                for rid in batch.rollout_ids:
                    fut = self._pending.pop(rid, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(exc)
                        fut.exception()
                raise
            # Each waiting submit gets the summary the commit stored, from the batch: not
            # looked up in the store, whose memory keeps the last 4,096 (a commit larger than
            # that, after a slow fsync at size, would read each one back from its shard).
            for rid in batch.rollout_ids:
                fut = self._pending.pop(rid, None)
                if fut is not None and not fut.done():
                    fut.set_result(batch.summaries[rid])
            if self._metrics is not None:
                for table, n in shards.items():
                    self._metrics.observe_shard(table, n)
                self._metrics.flush_counters()
            log.debug("reducer: %d rollouts durable in %.3f s", len(batch.rollout_ids), time.monotonic() - t0)
            return len(batch.rollout_ids)

    async def close(self) -> dict[str, Any]:
        """Flush everything and close the writers (idempotent)."""
        await self.flush()
        self._closed = True
        if self._metrics is not None:
            self._metrics.flush_counters()
            self._metrics.close()
        if self._flusher is not None:
            self._flusher.cancel()
        self.store.close()
        return json.loads(json.dumps(await self.stats()))


def _error(exc: BaseException) -> str:
    """A rollout's failure as ``submit_many`` answers it."""
    return f"{type(exc).__name__}: {exc}"


def _truncation(result: RolloutResult) -> dict[str, Any]:
    """Sample metadata of a truncated rollout: ``truncated`` and the budget that ran out
    (``budget``: max_turns / context / output, its ``limit``, the main ``turns`` done)."""
    stop = result.tree.budget_stop if result.tree is not None else None  # a TurnTree's or a Transcript's
    if result.status is not RolloutStatus.TRUNCATED or stop is None:
        return {}
    return {"truncated": True, "truncated_by": stop.as_dict()}
