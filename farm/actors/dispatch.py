"""The driver's dispatch loop: rollouts onto a pool of sandbox actors, with
backpressure, re-dispatch of rollouts whose actor died, a per-rollout guard timeout,
and cancellation on Ctrl-C. Each dispatch pass sends an actor every rollout it gives it in
one call, whose answers stream back as each rollout ends (``farm.actors.batches``).
Whether a rollout runs again is the reducer's decision (``farm.rollout.retry.decide``, asked
there only), for every attempt's end: one a sandbox actor handed it, and one the dispatcher
saw end around the pipeline (an actor lost, a rollout hung or aborted as stale, an actor's
bug, no actor left), which it hands the reducer as a result whose ``ending`` says so
(``_end``). The dispatcher only carries the decision out.

Which actor takes a rollout, and which may take none (lost a rollout, waiting for its
probe; retired), is ``farm.actors.pool.ActorPool``; ``farm.actors.membership`` keeps the Ray
refs that decide it (probes, joining actors) and tells the pool what they answered. An
actor pinned to a node that died is lost the same way (its node's rollouts go to the
other nodes), and sandbox actors started on nodes that join mid-run (``scale_out``)
enter the pool once ready.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from typing import Any, Callable

import ray
from ray.exceptions import RayTaskError, TaskCancelledError

from farm.actors.batches import CANCELLED, MAX_BATCH, Answer, InFlight, Sent
from farm.actors.dispatch_ports import Feed, Progress, Tally
from farm.actors.membership import ACTOR_LOST, CONTROL_TIMEOUT_S, Membership
from farm.actors.pool import ActorPool
from farm.config import FarmConfig
from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutResult, RolloutSpec, Runner
from farm.rollout.outcome import Ending, outcome_for_ending
from farm.status import RetryDecision, RetryKind, Verdict

log = logging.getLogger(__name__)

# Slack on top of rollout.timeout_s before the driver stops waiting for a rollout
# (the actor enforces timeout_s itself; this catches a hung actor).
GUARD_SLACK_S = 120.0
# How many finished rollout ids the dispatcher remembers to count each once (see _finish).
RECENT_IDS = 65_536


class Dispatcher:
    """Runs rollouts on a pool of sandbox actors: at most ``capacity`` per actor."""

    def __init__(
        self,
        cfg: FarmConfig,
        actors: dict[str, Any],
        reducer: Any,
        progress: Progress,
        tally: Tally,
        *,
        guard_s: float | None = None,
        scale_out: Callable[[], dict[str, Any]] | None = None,
        admit: Callable[[dict[str, str]], str | None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.actors = actors
        self.reducer = reducer
        self.progress = progress
        self.guard_s = guard_s if guard_s is not None else cfg.rollout.timeout_s + GUARD_SLACK_S
        self.pool = ActorPool(actors, capacity=cfg.rollout.concurrency, max_deaths=cfg.ray.actor_max_restarts + 1)
        self.members = Membership(actors, self.pool, progress, scale_out, admit)  # probes, joining actors
        self.inflight = InFlight()  # rollouts out at actors, and the batches (calls) they went in
        self.queue: deque[RolloutSpec] = deque()
        # What the run's summary needs, kept as rollouts finish (bounded: not one object per
        # rollout); the driver and the trainer's thread read it (``tally.summary(...)``, ``finished``).
        self.tally = tally
        # The ids finished last, to count a rollout once if it is handed back twice (a rollout
        # is queued, in flight or delayed at most once at a time, so a second hand-back can only
        # follow closely: a window of recent ids, not every id of the run).
        self._recent: deque[str] = deque()
        self._recent_ids: set[str] = set()
        self.delayed: list[tuple[float, RolloutSpec]] = []  # infrastructure retries waiting out their backoff
        self.homes: dict[str, str] = {}  # task id -> the actor that ran it first (its node has the environment)
        self.redispatched = 0
        self.retried = 0
        self.interrupted = False
        self.policy_version = 0
        self.stale_dropped = 0  # finished beyond stream.max_staleness, not recorded, run again (on_stale=drop)
        self.stale_aborted = 0  # cancelled at a weight update, run again (on_stale=abort)
        self._aborting: set[str] = set()  # rollout ids aborted as stale
        self._versions: queue.SimpleQueue[int] = queue.SimpleQueue()  # weight updates from the trainer's thread

    # --- loop ---------------------------------------------------------------
    def run(self, specs: list[RolloutSpec] = (), *, feed: Feed | None = None,
            stop: threading.Event | None = None) -> Tally:
        """Run ``specs``, then whatever ``feed`` hands out (pulled while the actors have free
        slots) until it is exhausted, or until ``stop`` is set (in-flight rollouts are
        then interrupted)."""
        self.queue.extend(specs)
        try:
            while self.queue or self.inflight or self.delayed or (feed is not None and not feed.exhausted):
                if stop is not None and stop.is_set():
                    self.interrupted = True
                    self.cancel_inflight(self.cfg.ray.drain_timeout_s)
                    break
                self._apply_versions()
                self._release_delayed(time.monotonic())
                self._feed(feed)
                if not self.interrupted:
                    self.members.grow()
                self._dispatch()
                if not self.inflight and not self.members.refs:
                    if self.pool.empty and (self.queue or _finite_left(feed)):
                        self._give_up_all("no sandbox actor left alive", feed)
                    elif self.delayed and not self.queue:
                        time.sleep(min(1.0, max(0.0, min(t for t, _ in self.delayed) - time.monotonic())))
                    elif feed is not None and not self.queue:
                        time.sleep(0.05)  # back-pressure: the trainer has not consumed enough yet
                    continue
                refs = [*self.inflight.batches, *self.members.refs]
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.2 if feed is not None else 1.0, fetch_local=False)
                if ready:
                    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
                for ref in ready:
                    if self.members.owns(ref):
                        self.members.answered(ref)
                    else:
                        self._collect(ref)
                self._guard(time.monotonic())
        except KeyboardInterrupt:
            self.interrupted = True
            self.progress.note("interrupted: cancelling in-flight rollouts (Ctrl-C again to stop at once)")
            self.cancel_inflight(self.cfg.ray.drain_timeout_s)
        return self.tally

    @property
    def finished(self) -> int:
        """Rollouts finished so far (recorded, or interrupted)."""
        return self.tally.count

    def _feed(self, feed: Feed | None) -> None:
        """Pull groups while the actors have free slots for them."""
        if feed is None:
            return
        free = self.pool.free_slots
        while len(self.queue) < free:
            group = feed.next()
            if group is None:
                return
            self.queue.extend(group)
            if feed.total is None:  # a finite run's total was known up front
                self.progress.grow(len(group))

    # --- weight versions and staleness -----------------------------------------
    def set_policy_version(self, version: int) -> None:
        """The trainer pushed new weights (any thread): applied by the loop."""
        self._versions.put(int(version))

    def _apply_versions(self) -> None:
        while True:
            try:
                self.policy_version = max(self.policy_version, self._versions.get_nowait())
            except queue.Empty:
                break
            for item in self.inflight:
                rid = item.spec.rollout_id
                if rid not in self._aborting and self.cfg.stream.too_stale(item.version, self.policy_version, "running"):
                    self._aborting.add(rid)
                    self.actors[item.actor].abort.remote(rid)  # its answer comes back cancelled

    def _dispatch(self) -> None:
        plan: dict[str, list[RolloutSpec]] = {}
        while self.queue:
            spec = self.queue[0]
            home = self.homes.get(spec.task.id) if self.cfg.ray.env_affinity else None
            name = self.pool.pick(prefer=home)
            if name is None:
                break
            self.homes.setdefault(spec.task.id, name)
            self.queue.popleft()
            self.pool.took(name)
            plan.setdefault(name, []).append(spec)
        now = time.monotonic()
        for name, specs in plan.items():
            for i in range(0, len(specs), MAX_BATCH):
                batch = specs[i : i + MAX_BATCH]
                stream = self.actors[name].run_many.remote(batch)
                self.inflight.sent(stream, [Sent(spec, name, now, self.policy_version) for spec in batch])

    def _back(self, rollout_id: str) -> Sent | None:
        """Take a rollout off the actor it was out at (None: no longer out)."""
        item = self.inflight.back(rollout_id)
        if item is not None:
            self.pool.freed(item.actor)
        return item

    def _drop(self, batch: Any) -> list[Sent]:
        """Forget a batch's stream; its rollouts still out are taken off their actor."""
        items = self.inflight.drop(batch)
        for item in items:
            self.pool.freed(item.actor)
        return items

    def _collect(self, batch: Any) -> None:
        """The next message of a batch's stream: answers, or why there are no more."""
        try:
            answers: list[Answer] = ray.get(next(batch))
        except StopIteration:  # every rollout of it answered (one still out here was never answered)
            for item in self._drop(batch):
                self._on_lost(item.spec, item.actor, "its actor's call ended without answering it")
            return
        except TaskCancelledError:  # cancelled (the guard, or a stop): those still out were interrupted
            for item in self._drop(batch):
                self._settle(item, item.spec.interrupted(item.actor))
            return
        except ACTOR_LOST as exc:
            items = self._drop(batch)
            if items:
                self.members.lost(items[0].actor)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for item in items:
                self._on_lost(item.spec, item.actor, why)
            return
        except RayTaskError as exc:  # a bug in SandboxActor.run_many itself
            for item in self._drop(batch):
                self._settle(item, self._raised(item, repr(exc.cause)))
            return
        for answer in answers:
            item = self._back(answer.rollout_id)
            if item is None:  # the guard ended it already
                continue
            if answer.summary is not None:
                summary = answer.summary
            elif answer.error == CANCELLED:
                summary = item.spec.interrupted(item.actor)
            else:
                summary = self._raised(item, answer.error)
            self._settle(item, summary)
        if self.inflight.empty(batch):  # all answered: nothing more to wait for on it
            self._drop(batch)

    def _raised(self, item: Sent, error: str) -> RolloutSummary:
        """A bug inside SandboxActor.run (it maps every rollout error itself): the reducer
        records it at once (a bug does not go away on a rerun)."""
        return self._end(item.spec, Ending.ACTOR_FAILED, f"sandbox actor raised: {error}", item.actor)

    def _settle(self, item: Sent, summary: RolloutSummary) -> None:
        """A rollout came back: carry out what the reducer decided of it."""
        spec = item.spec
        aborted = spec.rollout_id in self._aborting
        self._aborting.discard(spec.rollout_id)
        if summary.durable or self.interrupted:
            self._finish(summary)
            return
        why = f"{summary.status.value} ({summary.reason[:120]})"
        if aborted and summary.retry is not None and summary.retry.verdict is Verdict.DROP:
            # cancelled by the abort at a weight update: the attempt ended as too stale
            self.stale_aborted += 1
            summary = self._end(spec, Ending.TOO_STALE, f"aborted as stale at weight version {self.policy_version}",
                                item.actor)  # fmt: skip
            why = f"aborted as stale at weight version {self.policy_version}"
        self._carry_out(spec, summary, why, aborted=aborted)

    def _carry_out(self, spec: RolloutSpec, summary: RolloutSummary, why: str, *, aborted: bool = False) -> None:
        """Carry out the reducer's decision of an attempt: run it again, or count it finished
        (recorded, or dropped for the next invocation)."""
        decision = summary.retry
        if not summary.durable and decision is not None and decision.runs_again:
            self._run_again(spec, decision, why, aborted=aborted)
        else:
            self._finish(summary)

    def _run_again(self, spec: RolloutSpec, decision: RetryDecision, why: str, *, aborted: bool = False) -> None:
        """Carry out a RUN_AGAIN: the next attempt, spending ``decision.kind``'s budget. An
        infrastructure retry waits out its backoff; the others go first in the queue."""
        again = spec.next(decision.kind)
        if decision.kind is RetryKind.INFRASTRUCTURE:
            self.retried += 1
            self.progress.note(f"{spec.rollout_id}: {why}; retrying in {decision.delay_s:g} s "
                               f"(attempt {again.attempt}, {decision.reason})")  # fmt: skip
            self.delayed.append((time.monotonic() + decision.delay_s, again))
            return
        if decision.kind is RetryKind.ACTOR_LOST:
            self.redispatched += 1
            self.progress.note(f"{spec.rollout_id}: {why}; re-dispatching (attempt {again.attempt}, {decision.reason})")
        elif not aborted:  # finished too stale, not recorded (on_stale=drop): under the current weights now
            self.stale_dropped += 1
        self.queue.appendleft(again)

    def _release_delayed(self, now: float) -> None:
        due = [spec for t, spec in self.delayed if t <= now]
        if due:
            self.delayed = [(t, spec) for t, spec in self.delayed if t > now]
            self.queue.extend(due)

    def _on_lost(self, spec: RolloutSpec, actor: str, why: str) -> None:
        """Its actor died under it: the reducer answers what it stored (made durable before the
        actor died), or decides the attempt's end."""
        self._carry_out(spec, self._end(spec, Ending.ACTOR_LOST, why, actor), f"actor {actor} lost it ({why})")

    def _guard(self, now: float) -> None:
        self.members.guard(now)
        for batch in self.inflight.batches:  # a batch's rollouts went out together: one age
            started = self.inflight.started(batch)
            if started is None or now - started <= self.guard_s:
                continue
            ray.cancel(batch)  # what still runs of it is cancelled at the actor, if it hears
            for item in self._drop(batch):
                self._aborting.discard(item.spec.rollout_id)
                reason = f"rollout exceeded {self.cfg.rollout.timeout_s:g} s (driver guard: the actor did not answer)"
                self._carry_out(item.spec, self._end(item.spec, Ending.HUNG, reason, item.actor), reason)

    def _give_up_all(self, reason: str, feed: Feed | None = None) -> None:
        """Record every queued rollout failed, and the rest of a finite feed with them
        (the run ends; an endless feed waits to be stopped)."""
        while self.queue or _finite_left(feed):
            if not self.queue:
                self.queue.extend(feed.next() or ())
                continue
            spec = self.queue.popleft()
            self._finish(self._end(spec, Ending.GIVEN_UP, reason, ""))

    def _end(self, spec: RolloutSpec, ending: Ending, reason: str, actor: str) -> RolloutSummary:
        """An attempt the dispatcher saw end around the pipeline, handed to the reducer, which
        decides what becomes of it; returns its answer: what it holds for the rollout (first
        write wins), or the attempt handed back with that decision."""
        now = time.time()
        result = RolloutResult.of(spec, Runner.of(self.cfg, actor=actor), outcome_for_ending(ending, reason),
                                  started_at=now, finished_at=now, ending=ending)  # fmt: skip
        return ray.get(self.reducer.submit.remote(result), timeout=CONTROL_TIMEOUT_S)

    def _finish(self, summary: RolloutSummary) -> None:
        rid = summary.rollout_id
        if rid in self._recent_ids:
            return
        self._recent.append(rid)
        self._recent_ids.add(rid)
        while len(self._recent) > RECENT_IDS:
            self._recent_ids.discard(self._recent.popleft())
        self.tally.add(summary)
        self.progress.advance(summary, len(self.inflight))

    def cancel_inflight(self, drain_s: float) -> None:
        """Stop: every in-flight rollout is interrupted (not recorded: the next invocation
        runs it again); wait (bounded) for their cleanup."""
        self.queue.clear()
        for _, spec in self.delayed:
            self._finish(spec.interrupted(""))
        self.delayed.clear()
        # The reducer first learns the run is stopping: a rollout that ends now (its sandbox
        # closed under it, its CLI killed) is dropped for the next invocation, never recorded
        # as a failure nor run again.
        _wait_quietly([self.reducer.stop_accepting.remote()], 10.0)
        for batch in self.inflight.batches:
            ray.cancel(batch)
        deadline = time.monotonic() + drain_s
        try:
            while self.inflight and time.monotonic() < deadline:
                batches = self.inflight.batches
                ready, _ = ray.wait(batches, num_returns=len(batches),
                                    timeout=min(1.0, max(0.0, deadline - time.monotonic())))  # fmt: skip
                for batch in ready:
                    self._drain(batch)
        except KeyboardInterrupt:
            pass
        for item in self.inflight:
            self._back(item.spec.rollout_id)
            self._finish(item.spec.interrupted(item.actor))
        for batch in self.inflight.batches:
            self._drop(batch)

    def _drain(self, batch: Any) -> None:
        """A stopping run's next message of a batch: what it answered is final; when it is
        cancelled (or its actor died cleaning up) those still out were interrupted."""
        try:
            answers: list[Answer] = ray.get(next(batch))
        except Exception:  # noqa: BLE001 - cancelled, ended, or the actor died while cleaning up
            for item in self._drop(batch):
                self._finish(item.spec.interrupted(item.actor))
            return
        for answer in answers:
            item = self._back(answer.rollout_id)
            if item is not None:
                self._finish(answer.summary if answer.summary is not None else item.spec.interrupted(item.actor))
        if self.inflight.empty(batch):
            self._drop(batch)


def _finite_left(feed: Feed | None) -> bool:
    """``feed`` is a finite run's and has groups left to hand out."""
    return feed is not None and feed.total is not None and not feed.exhausted


def _wait_quietly(refs: list[Any], timeout: float) -> None:
    try:
        ray.get(refs, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a dead actor has nothing in flight to tell
        log.debug("stop notice not delivered: %s", exc)
