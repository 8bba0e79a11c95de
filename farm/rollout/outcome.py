"""The ONE place where what happened to a rollout becomes its status.

The others report facts and ask here: the pipeline runs in phases, and whatever escapes a
phase is passed, with the phase, to ``outcome_for_error``; the agent's own end (exit code,
budget, how the harness runner saw the CLI end: ``HarnessEnd``) goes through
``outcome_for_agent``; a broken sandbox limit through ``outcome_for_breaches``; the
grader's verdict (``GradeStatus``) through ``outcome_for_grade``; a hosted endpoint's
failure (``Failure``) through ``outcome_for_endpoint``; an attempt the driver, an actor or
a caller ended around the pipeline (an actor lost, hung, too stale, the run stopped, a
caller's abort: ``Ending``) through ``outcome_for_ending``. Nothing else in farm names a
status to record (tests/test_structure.py holds every other module to comparing them).
"""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import Any, Literal

from farm.errors import (
    EngineError,
    GatewayError,
    GradingError,
    HarnessError,
    HarnessInstallError,
    HarnessTimeout,
    PatchApplyError,
    SandboxError,
    SandboxTimeout,
    SetupError,
    TaskError,
)
from farm.gateway.hosted import Failure
from farm.grading.report import GradeStatus
from farm.harnesses.plan import HarnessEnd
from farm.status import FailureClass, Outcome, RolloutStatus
from farm.trajectory.records import BudgetStop, FinishReason, TurnFlag


class Phase(str, Enum):
    CREATE_SANDBOX = "create_sandbox"
    PREPARE = "prepare"
    SESSION = "session"
    AGENT = "agent"
    CAPTURE = "capture"
    GRADE = "grade"


class Ending(str, Enum):
    """How an attempt ended, as whoever saw it end reports it."""

    FINISHED = "finished"  # the pipeline returned its outcome (the usual case): not ``outcome_for_ending``'s
    ACTOR_LOST = "actor_lost"  # its sandbox actor (or node) died under it
    TOO_STALE = "too_stale"  # finished or aborted beyond stream.max_staleness
    HUNG = "hung"  # the driver's guard gave up waiting for the actor
    STOPPED = "stopped"  # the run was stopped while it ran: the next invocation runs it again
    ACTOR_FAILED = "actor_failed"  # the code around the pipeline (the actor running it) raised: a bug in farm
    GIVEN_UP = "given_up"  # the run gave up on it before it ran (no sandbox actor left to run it)
    ABORTED = "aborted"  # its caller aborted it (farm.single)


# what an attempt that did not finish in the pipeline is recorded as
_ENDED_AS = {
    Ending.ACTOR_LOST: RolloutStatus.SANDBOX_ERROR,
    Ending.TOO_STALE: RolloutStatus.STALE,
    Ending.HUNG: RolloutStatus.SANDBOX_ERROR,  # a hung actor is an infrastructure failure like any other
    Ending.STOPPED: RolloutStatus.INTERRUPTED,
    Ending.ACTOR_FAILED: RolloutStatus.SANDBOX_ERROR,
    Ending.GIVEN_UP: RolloutStatus.SANDBOX_ERROR,
    Ending.ABORTED: RolloutStatus.ABORTED,
}


def outcome_for_ending(ending: Ending, reason: str) -> Outcome:
    """An attempt that ended around the pipeline (``ending``: not ``FINISHED``), with ``reason``."""
    if ending is Ending.FINISHED:
        raise ValueError("a finished attempt's outcome is the pipeline's (outcome_for_error / outcome_for_agent)")
    return Outcome(status=_ENDED_AS[ending], reason=reason)


def outcome_for_breaches(breaches: list[str]) -> Outcome:
    """The agent broke its sandbox's limits (memory, processes, disk, lifetime): the policy's
    doing, reward 0, never graded."""
    return Outcome(status=RolloutStatus.LIMIT_EXCEEDED, reason="; ".join(breaches))


def outcome_for_endpoint(failure: Failure | str, reason: str) -> Outcome:
    """A hosted endpoint failed the session for good (black-box mode): a refused key is
    configuration (``auth_error``, never retried), anything else the endpoint's failure."""
    status = RolloutStatus.AUTH_ERROR if Failure(failure) is Failure.AUTH else RolloutStatus.ENGINE_ERROR
    return Outcome(status=status, reason=reason)


def outcome_for_grade(verdict: GradeStatus | None, reason: str) -> Outcome:
    """The rollout status a grading implies (``verdict``: the grader's; None: graded without
    one, as a stand-in grader does): graded, whatever the reward, is ``completed``."""
    if verdict is GradeStatus.PATCH_FAILED:
        return Outcome(status=RolloutStatus.PATCH_FAILED, reason=reason)
    if verdict in (GradeStatus.SETUP_FAILED, GradeStatus.ENV_BROKEN, GradeStatus.ERROR):
        return Outcome(status=RolloutStatus.SETUP_FAILED, reason=f"grading: {reason}")
    return Outcome(status=RolloutStatus.COMPLETED, reason=reason)


# what the agent's run means, by how the CLI ended (None: it ran to its end)
_HARNESS_ENDS: dict[HarnessEnd, RolloutStatus | None] = {
    HarnessEnd.FINISHED: None,
    HarnessEnd.ERROR_REPORTED: RolloutStatus.AGENT_ERROR,
    HarnessEnd.EXITED: RolloutStatus.AGENT_ERROR,
    HarnessEnd.TIMED_OUT: RolloutStatus.TIMEOUT,
    HarnessEnd.MODEL_PATH_LOST: RolloutStatus.ENGINE_ERROR,  # the model path failed under it, not the CLI
    HarnessEnd.GATEWAY_UNREACHABLE: RolloutStatus.ENGINE_ERROR,
    HarnessEnd.IDLE: RolloutStatus.AGENT_ERROR,  # neither a request in flight nor a tool running: the CLI hung
}


def _msg(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def outcome_for_error(exc: BaseException, phase: Phase) -> Outcome:
    """Map an exception raised in ``phase`` to exactly one status + reason; a ``deterministic``
    error (``FarmError.deterministic``: a missing repository, a setup command's own error)
    makes a deterministic outcome, which the retry decision records without a rerun."""
    outcome = _outcome_for_error(exc, phase)
    if getattr(exc, "deterministic", False) and outcome.status.failure_class is FailureClass.INFRASTRUCTURE:
        return outcome.model_copy(update={"deterministic": True})
    return outcome


def _outcome_for_error(exc: BaseException, phase: Phase) -> Outcome:
    S = RolloutStatus
    where = phase.value
    if isinstance(exc, asyncio.CancelledError):
        return Outcome(status=S.CANCELLED, reason=f"cancelled during {where}")
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) and not isinstance(exc, SandboxError):
        return outcome_for_timeout(phase, f"timed out during {where}: {_msg(exc)}")
    if isinstance(exc, PatchApplyError):
        return Outcome(status=S.PATCH_FAILED, reason=f"the model's diff does not apply: {_msg(exc)}")
    if isinstance(exc, (SetupError, TaskError)):
        return Outcome(status=S.SETUP_FAILED, reason=f"workspace setup failed: {_msg(exc)}")
    if isinstance(exc, HarnessTimeout):
        return Outcome(status=S.TIMEOUT, reason=f"agent exceeded its budget: {_msg(exc)}")
    if isinstance(exc, SandboxTimeout):
        if phase is Phase.PREPARE:
            return Outcome(status=S.SETUP_FAILED, reason=f"setup command timed out: {_msg(exc)}")
        if phase is Phase.AGENT:
            return Outcome(status=S.TIMEOUT, reason=f"agent command timed out: {_msg(exc)}")
        return Outcome(status=S.SANDBOX_ERROR, reason=f"sandbox command timed out during {where}: {_msg(exc)}")
    if isinstance(exc, HarnessInstallError):
        # The CLI could not be installed: infrastructure, never the model's fault.
        return Outcome(status=S.SANDBOX_ERROR, reason=f"agent CLI install failed: {_msg(exc)}")
    if isinstance(exc, HarnessError):
        return Outcome(status=S.AGENT_ERROR, reason=f"agent CLI failed: {_msg(exc)}")
    if isinstance(exc, (EngineError, GatewayError)):
        return Outcome(status=S.ENGINE_ERROR, reason=f"model path failed during {where}: {_msg(exc)}")
    if isinstance(exc, SandboxError):
        return Outcome(status=S.SANDBOX_ERROR, reason=f"sandbox failed during {where}: {_msg(exc)}")
    if isinstance(exc, GradingError):
        return Outcome(status=S.GRADING_ERROR, reason=f"grader failed: {_msg(exc)}")
    # An unwrapped error from the system (a socket, a file): infrastructure, not the model, and
    # a rerun may meet a better moment.
    if isinstance(exc, OSError):
        return Outcome(status=S.SANDBOX_ERROR, reason=f"system error during {where}: {type(exc).__name__}: {_msg(exc)}")
    # Anything else is a bug in farm (or a library it calls): infrastructure, not the model,
    # and a rerun would meet the same code: recorded once, never retried (as the dispatcher
    # treats a bug of its own).
    return Outcome(status=S.SANDBOX_ERROR, deterministic=True,
                   reason=f"internal error during {where}: {type(exc).__name__}: {_msg(exc)}")


def outcome_for_timeout(phase: Phase, reason: str, *, final_answer_given: bool = False) -> Outcome:
    """A budget ran out in ``phase``: the agent's phase is the policy's (``timeout``),
    unless the policy had already given its final answer (its last turn called no tool):
    then the CLI, or farm, failed to end, which is infrastructure (``agent_error``).
    Anywhere else (sandbox create, setup, capture, grading) it is infrastructure."""
    S = RolloutStatus
    if phase is Phase.AGENT and final_answer_given:
        return Outcome(status=S.AGENT_ERROR, reason=f"{reason}, after the policy's final answer: the CLI did not end")
    if phase is Phase.AGENT:
        return Outcome(status=S.TIMEOUT, reason=reason)
    if phase is Phase.GRADE:
        return Outcome(status=S.GRADING_ERROR, reason=reason)
    if phase is Phase.PREPARE:
        return Outcome(status=S.SETUP_FAILED, reason=reason)
    return Outcome(status=S.SANDBOX_ERROR, reason=reason)


def outcome_for_agent(
    *,
    exit_code: int | None,
    timed_out: bool,
    budget_s: float,
    stderr_tail: str = "",
    engine_errors: int = 0,
    harness_end: HarnessEnd | None = None,
    harness_reason: str = "",
    budget_stop: BudgetStop | None = None,
) -> Outcome | None:
    """How the agent ended. None means "ran to its end normally: go on and grade".

    ``budget_stop``: the gateway ended the policy's session because a budget ran out
    (turns, context, output): ``truncated``, whatever the CLI did after it. farm knows
    this from its own gateway, never from the CLI's words; a CLI that then exits with an
    error or hangs is named in the reason, and the policy's data up to the stop is whole.
    ``harness_end``: how the harness runner (or farm's idle watch) saw the CLI end, which
    wins when present. An agent that failed after the engine failed under it is
    an engine error, not an agent error.
    """
    S = RolloutStatus
    harness_status = _HARNESS_ENDS[harness_end] if harness_end is not None else None
    if budget_stop is not None:
        then = ""
        if harness_status is not None:
            then = f" (then the CLI: {harness_reason or harness_status.value})"
        elif timed_out:
            then = f" (then the CLI did not end within {budget_s:g} s)"
        elif exit_code not in (0, None):
            then = f" (then the CLI exited {exit_code})"
        return Outcome(status=S.TRUNCATED, reason=budget_stop.reason + then)
    if harness_status is not None:
        status = harness_status
        if status is S.AGENT_ERROR and engine_errors:
            return Outcome(status=S.ENGINE_ERROR, reason=f"{engine_errors} engine error(s); {harness_reason}".strip())
        return Outcome(status=status, reason=harness_reason or f"agent ended with {status.value}")
    if timed_out:
        return Outcome(status=S.TIMEOUT, reason=f"agent exceeded {budget_s:g} s")
    if exit_code not in (0, None):
        tail = stderr_tail.strip()[-300:]
        if engine_errors:
            return Outcome(status=S.ENGINE_ERROR, reason=f"agent exited {exit_code} after {engine_errors} engine error(s)")
        return Outcome(status=S.AGENT_ERROR, reason=f"agent exited {exit_code}: {tail}" if tail else f"agent exited {exit_code}")
    return None


# rollout.on_truncated: what becomes of a rollout whose policy ran out of its budget
OnTruncated = Literal["grade", "zero", "exclude"]


def grades_truncated(on_truncated: OnTruncated) -> bool:
    """Whether a truncated rollout's diff is graded: not under ``zero`` (reward 0, ungraded)."""
    return on_truncated != "zero"


def writes_samples(status: RolloutStatus, *, writes_tokens: bool, hack_action: str | None,
                   on_truncated: OnTruncated) -> bool:  # fmt: skip
    """Whether a recorded rollout becomes training Samples; its row is kept either way.

    Only a policy outcome is training data (an infrastructure failure keeps its row, status,
    reason and log tail as evidence); a black-box rollout (a hosted endpoint: a transcript, no
    tokens) never is; nor one the grading excluded (``grading.on_hack: exclude``), nor a
    truncated one under ``on_truncated: exclude`` (DAPO-style overlong filtering: graded, kept)."""
    if not status.trainable or not writes_tokens or hack_action == "exclude":
        return False
    return not (status is RolloutStatus.TRUNCATED and on_truncated == "exclude")


def truncated_outcome(truncated: Outcome, grade: Outcome | None) -> Outcome:
    """A truncated rollout after grading (``rollout.on_truncated`` grade / exclude; None:
    not graded, ``zero``): it stays ``truncated`` (the grade's reward is its reward), a
    diff that does not apply says so in the reason, and a grader that failed is that
    infrastructure failure (retried like any)."""
    if grade is None or grade.status is RolloutStatus.COMPLETED:
        return truncated
    if grade.status is RolloutStatus.PATCH_FAILED:
        return Outcome(status=RolloutStatus.TRUNCATED, reason=f"{truncated.reason}; {grade.reason}")
    return grade


def final_answer_given(tree: Any) -> bool:
    """Did the session's last model turn (side requests aside) end the agent's work: a
    normal stop with no tool call?"""
    turns = [t for t in (getattr(tree, "turns", None) or []) if t.trainable or TurnFlag.SIDE_REQUEST not in t.flags]
    if not turns:
        return False
    last = turns[-1]
    calls = (last.response or {}).get("tool_calls") or []
    return last.finish_reason is FinishReason.STOP and not calls
