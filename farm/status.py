"""The one status vocabulary of a rollout: a str Enum plus a reason, and its classes.

Every status belongs to exactly one class:

- **policy outcomes** (``FailureClass.POLICY``): the policy's own doing: it finished
  (and was graded), ran out of its time budget, ran out of its turn, context or output
  budget (``truncated``: the gateway ended its session there), broke its sandbox's
  resource limits, or produced a diff that does not apply. These are trainable: their
  Samples carry the reward the rollout earned (0 for all but ``completed``, and
  ``truncated`` graded as it stands under ``rollout.on_truncated: grade``).
- **infrastructure failures** (``FailureClass.INFRASTRUCTURE``): the sandbox backend,
  the engine, the harness CLI, the task's setup or the grader failed, or the run was
  stopped. These never train: their Samples (if any are kept) are marked untrainable
  and the default readers skip them; a rerun or a retry runs the rollout again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, ConfigDict


class FailureClass(str, Enum):
    POLICY = "policy"  # trainable, rewarded
    INFRASTRUCTURE = "infrastructure"  # never trainable; retried / rerun


class RolloutStatus(str, Enum):
    """Every rollout ends with exactly one of these."""

    COMPLETED = "completed"  # the agent finished and was graded (reward may be 0)
    TIMEOUT = "timeout"  # the agent exceeded its own budget (policy: reward 0)
    TRUNCATED = "truncated"  # the policy ran out of its turn / context / output budget (the reason names which)
    LIMIT_EXCEEDED = "limit_exceeded"  # the agent broke its sandbox's memory/process/disk/time limits
    PATCH_FAILED = "patch_failed"  # the model's diff could not be applied (reward 0)
    AGENT_ERROR = "agent_error"  # the CLI crashed / exited abnormally (not known to be the model's doing)
    SETUP_FAILED = "setup_failed"  # workspace preparation failed: never a zero reward
    SANDBOX_ERROR = "sandbox_error"  # the sandbox backend (or farm itself) failed
    ENGINE_ERROR = "engine_error"  # the inference engine (or a hosted endpoint) failed
    AUTH_ERROR = "auth_error"  # a hosted endpoint refused farm's API key (401/403): configuration, not the policy
    GRADING_ERROR = "grading_error"  # the grader's infrastructure failed (not the model's tests)
    INTERRUPTED = "interrupted"  # the run was stopped (signal) while it ran: rerun it
    CANCELLED = "cancelled"  # the rollout was cancelled (no record is kept: a rerun runs it)
    STALE = "stale"  # began under weights older than rollout.max_staleness allows: dropped or aborted, run again
    ABORTED = "aborted"  # a user aborted this one rollout (farm.single): never trainable, never stored

    @property
    def failure_class(self) -> FailureClass:
        return FailureClass.POLICY if self in POLICY_STATUSES else FailureClass.INFRASTRUCTURE

    @property
    def trainable(self) -> bool:
        """May Samples of a rollout that ended so be trained on?"""
        return self in POLICY_STATUSES

    @property
    def reruns(self) -> bool:
        """Does a later invocation of the same run run this rollout again?"""
        return self in (RolloutStatus.INTERRUPTED, RolloutStatus.CANCELLED)


POLICY_STATUSES = frozenset(
    {RolloutStatus.COMPLETED, RolloutStatus.TIMEOUT, RolloutStatus.TRUNCATED, RolloutStatus.LIMIT_EXCEEDED,
     RolloutStatus.PATCH_FAILED}
)


class Outcome(BaseModel):
    """A status with its reason, e.g. (TIMEOUT, "agent exceeded 1800 s")."""

    model_config = ConfigDict(frozen=True)

    status: RolloutStatus
    reason: str = ""
    deterministic: bool = False  # an infrastructure failure every attempt would meet again: never retried

    @property
    def trainable(self) -> bool:
        return self.status.trainable


# --- what becomes of an attempt: the retry decision's data (``farm.rollout.retry.decide`` makes
# it; declared here, at the bottom, because a rollout's summary carries it from the actor that
# decided to the dispatcher that carries it out, and that summary is a row of the output directory)


class RetryKind(str, Enum):
    """What made a rollout run again: each kind has its own budget."""

    INFRASTRUCTURE = "infrastructure"
    ACTOR_LOST = "actor_lost"
    STALE = "stale"


class Verdict(str, Enum):
    RECORD = "record"  # final: hand it to the reducer (under ``RetryDecision.status`` when set)
    RUN_AGAIN = "run_again"  # in this run, as a new attempt of ``RetryDecision.kind``
    DROP = "drop"  # not recorded: a later invocation of the run runs it again


@dataclass(frozen=True)
class RetryDecision:
    """What to do with an attempt that ended. ``status``/``reason``, on a RECORD, are what
    it is recorded as when that differs from how it ended (e.g. ``sandbox_error``,
    "sandbox actor died 3 time(s) under this rollout"); on the other verdicts ``reason``
    says why, for the progress log."""

    verdict: Verdict
    kind: RetryKind | None = None
    delay_s: float = 0.0
    status: RolloutStatus | None = None
    reason: str = ""

    @property
    def runs_again(self) -> bool:
        return self.verdict is Verdict.RUN_AGAIN
