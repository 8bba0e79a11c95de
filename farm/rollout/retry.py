"""Does a rollout run again? The one answer, as a pure function (no Ray, no I/O).

A rollout attempt ends in one of a few ways, and each way that may run it again spends
its own budget:

- **infrastructure**: the sandbox, engine, CLI, setup or grader failed, or the driver's
  guard gave up on an actor that did not answer (a hung actor): ``rollout.infra_retries``
  reruns, after an exponential backoff (``rollout.retry_backoff_s``, doubling).
- **actor lost**: the sandbox actor running it died (or its node did):
  ``rollout.max_attempts - 1`` re-dispatches.
- **stale**: it finished (or was aborted) beyond ``stream.max_staleness``:
  ``stream.max_stale_reruns`` reruns under the current weights.

A budget counts only its own kind, so an actor death does not use up infrastructure
retries and the other way round. An infrastructure failure that every attempt would meet
again (``deterministic``, from ``farm.errors.FarmError.deterministic``: a missing repository
or commit, a mirror lacking objects of the tree, a requirement this machine lacks, a setup
command exiting with an error of its own, an environment whose build failed) is recorded at
once, with its reason: no rerun can change it. Policy outcomes (``completed``, ``timeout``,
``truncated``, ``limit_exceeded``, ``patch_failed``) are the policy's doing and always
recorded; so are ``auth_error`` (a refused key stays refused) and ``aborted`` (a
caller's decision). A rollout stopped under it (``interrupted``/``cancelled``, or any
unfinished one once the run is stopping) is dropped: not recorded, the next invocation
of the run runs it again.

A bug in farm around the pipeline (``Ending.ACTOR_FAILED``: the actor running it raised) is
recorded at once, as a bug inside the pipeline is (``farm.rollout.outcome`` makes that one
deterministic): a rerun would meet the same code. A rollout the run gave up on
(``Ending.GIVEN_UP``: no actor left to run it) is recorded too.

One caller asks, for every attempt's end: the reducer (``farm.actors.reducer``), where every
attempt ends up. A sandbox actor hands it each rollout that finished; the dispatcher hands it
the attempts it saw end around the pipeline (an actor lost, a rollout hung, aborted as stale, a
bug in the actor, given up), as a result whose ``ending`` says so. The reducer holds the one
stop flag (``stop_accepting``: it hears the run's stop before the in-flight rollouts are
cancelled). A decision travels with the attempt it was made for
(``RolloutSummary.handed_back``); only the dispatcher carries a ``RUN_AGAIN`` out, and it never
decides anything itself. (The decision's data, ``RetryDecision``, ``Verdict`` and
``RetryKind``, is declared in ``farm.status``: a rollout's summary carries it.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from farm.rollout.outcome import Ending, outcome_for_ending
from farm.status import FailureClass, RetryDecision, RetryKind, RolloutStatus, Verdict


class Reruns(BaseModel):
    """Reruns a rollout has spent so far, per kind (0 on its first attempt)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    infrastructure: int = Field(default=0, ge=0)
    actor_lost: int = Field(default=0, ge=0)
    stale: int = Field(default=0, ge=0)

    @property
    def total(self) -> int:
        return self.infrastructure + self.actor_lost + self.stale

    def spent(self, kind: RetryKind) -> int:
        return getattr(self, kind.value)

    def after(self, kind: RetryKind) -> Reruns:
        """These reruns plus one of ``kind``."""
        return self.model_copy(update={kind.value: self.spent(kind) + 1})


@dataclass(frozen=True)
class RetryBudgets:
    """Reruns allowed per kind, and the first infrastructure retry's delay. No defaults: the
    config's fields own them (``from_config``)."""

    infrastructure: int
    actor_lost: int
    stale: int
    backoff_s: float

    def of(self, kind: RetryKind) -> int:
        return getattr(self, kind.value)

    @classmethod
    def from_config(cls, cfg: Any) -> RetryBudgets:
        """From a FarmConfig (keys: rollout.infra_retries, rollout.max_attempts,
        rollout.retry_backoff_s, stream.max_stale_reruns)."""
        return cls(
            infrastructure=cfg.rollout.infra_retries,
            actor_lost=cfg.rollout.max_attempts - 1,  # max_attempts counts the first dispatch too
            stale=cfg.stream.max_stale_reruns,
            backoff_s=cfg.rollout.retry_backoff_s,
        )


RECORD = RetryDecision(Verdict.RECORD)


def decide(
    status: RolloutStatus,
    reruns: Reruns,
    budgets: RetryBudgets,
    *,
    ending: Ending = Ending.FINISHED,
    stopping: bool = False,
    deterministic: bool = False,
) -> RetryDecision:
    """The one retry decision for an attempt that ended with ``status`` (see the module doc);
    ``deterministic``: its failure would come back on every attempt. What it is recorded
    as when that differs from ``status`` is ``farm.rollout.outcome``'s (``outcome_for_ending``)."""
    graded = status in (RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED)  # finished to its end: keep it
    if (stopping and not graded) or status.reruns:
        stopped = outcome_for_ending(Ending.STOPPED,
                                     "the run was stopped while it ran: the next invocation runs it again")
        return RetryDecision(Verdict.DROP, status=stopped.status, reason=stopped.reason)
    if ending in (Ending.ACTOR_FAILED, Ending.GIVEN_UP):  # a bug in farm; no actor left: a rerun changes neither
        return RECORD
    if ending is Ending.ACTOR_LOST:
        died = reruns.actor_lost + 1
        return _again_or(RetryKind.ACTOR_LOST, reruns, budgets, ending,
                         f"sandbox actor died {died} time(s) under this rollout")
    if ending is Ending.HUNG:  # the actor did not answer: an infrastructure failure like any other
        return _again_or(RetryKind.INFRASTRUCTURE, reruns, budgets, ending,
                         f"infrastructure reruns used up ({budgets.infrastructure})")
    if ending is Ending.TOO_STALE or status is RolloutStatus.STALE:
        return _again_or(RetryKind.STALE, reruns, budgets, Ending.TOO_STALE,
                         f"too stale {reruns.stale + 1} time(s) (out of reruns)")
    if status.failure_class is FailureClass.POLICY:
        return RECORD
    if status in (RolloutStatus.AUTH_ERROR, RolloutStatus.ABORTED):  # a refused key stays refused; a caller's call
        return RECORD
    if deterministic:
        return RetryDecision(Verdict.RECORD, reason="not retried: every attempt would fail the same way")
    return _again_or(RetryKind.INFRASTRUCTURE, reruns, budgets, None, "")


def _again_or(kind: RetryKind, reruns: Reruns, budgets: RetryBudgets, ending: Ending | None,
              reason: str) -> RetryDecision:
    """RUN_AGAIN as ``kind`` while its budget lasts, else RECORD (as ``ending`` makes it, with
    ``reason``, when given; else as it ended)."""
    spent, allowed = reruns.spent(kind), budgets.of(kind)
    if spent < allowed:
        delay = budgets.backoff_s * 2**spent if kind is RetryKind.INFRASTRUCTURE else 0.0
        return RetryDecision(Verdict.RUN_AGAIN, kind, delay,
                             reason=f"{kind.value} rerun {spent + 1} of {allowed}")
    status = outcome_for_ending(ending, reason).status if ending is not None else None
    return RetryDecision(Verdict.RECORD, kind, status=status,
                         reason=reason or f"{kind.value} reruns used up ({allowed})")
