"""Every failure maps to exactly one status in one place."""

from __future__ import annotations

import asyncio

import pytest

from farm import errors as E
from farm.gateway.hosted import Failure
from farm.grading.report import GradeStatus
from farm.harnesses.plan import HarnessEnd
from farm.rollout.outcome import (
    Ending,
    Phase,
    outcome_for_agent,
    outcome_for_breaches,
    outcome_for_endpoint,
    outcome_for_ending,
    outcome_for_error,
    outcome_for_grade,
    truncated_outcome,
)
from farm.status import Outcome
from farm.status import RolloutStatus as S
from farm.trajectory.records import Budget, BudgetStop


@pytest.mark.parametrize(
    "exc, phase, status",
    [
        (asyncio.CancelledError(), Phase.AGENT, S.CANCELLED),
        (TimeoutError("x"), Phase.GRADE, S.GRADING_ERROR),
        (TimeoutError("x"), Phase.AGENT, S.TIMEOUT),
        (TimeoutError("x"), Phase.PREPARE, S.SETUP_FAILED),
        (TimeoutError("x"), Phase.CREATE_SANDBOX, S.SANDBOX_ERROR),
        (E.SetupError("pip failed"), Phase.PREPARE, S.SETUP_FAILED),
        (E.TaskError("no repo"), Phase.PREPARE, S.SETUP_FAILED),
        (E.SandboxTimeout("setup hung"), Phase.PREPARE, S.SETUP_FAILED),
        (E.SandboxTimeout("cli hung"), Phase.AGENT, S.TIMEOUT),
        (E.SandboxTimeout("git diff hung"), Phase.CAPTURE, S.SANDBOX_ERROR),
        (E.SandboxError("bwrap died"), Phase.CREATE_SANDBOX, S.SANDBOX_ERROR),
        (E.SandboxClosed("closed"), Phase.AGENT, S.SANDBOX_ERROR),
        (E.HarnessTimeout("budget"), Phase.AGENT, S.TIMEOUT),
        (E.HarnessError("npm"), Phase.AGENT, S.AGENT_ERROR),
        (E.HarnessInstallError("npm registry unreachable"), Phase.AGENT, S.SANDBOX_ERROR),
        (E.EngineError("router down"), Phase.SESSION, S.ENGINE_ERROR),
        (E.GatewayError("bind"), Phase.SESSION, S.ENGINE_ERROR),
        (E.PatchApplyError("garbage"), Phase.GRADE, S.PATCH_FAILED),
        (E.GradingError("pytest missing"), Phase.GRADE, S.GRADING_ERROR),
        (KeyError("bug"), Phase.CAPTURE, S.SANDBOX_ERROR),
    ],
)
def test_error_to_status(exc, phase, status):
    out = outcome_for_error(exc, phase)
    assert out.status is status
    assert out.reason
    # only the policy's own doing may be trained on
    policy = status in (S.TIMEOUT, S.PATCH_FAILED) and phase in (Phase.AGENT, Phase.GRADE)
    assert out.status.trainable is policy


def test_internal_error_reason_names_the_type_and_phase():
    out = outcome_for_error(KeyError("bug"), Phase.CAPTURE)
    assert "KeyError" in out.reason and "capture" in out.reason


def test_a_bug_is_recorded_once_a_system_error_retried():
    """A bug in farm meets the same code on a rerun: deterministic (recorded once, like the
    dispatcher's own bugs); an OS error (a reset socket, a full disk) may pass: retried."""
    from farm.rollout.retry import Reruns, RetryBudgets, decide

    budgets = RetryBudgets(infrastructure=2, actor_lost=2, stale=3, backoff_s=0.0)
    for exc, retried in [(KeyError("bug"), False), (AttributeError("x"), False),
                         (ConnectionResetError("peer"), True), (OSError(28, "No space left"), True)]:  # fmt: skip
        out = outcome_for_error(exc, Phase.AGENT)
        assert out.status is S.SANDBOX_ERROR and out.deterministic is not retried, exc
        assert decide(out.status, Reruns(), budgets, deterministic=out.deterministic).runs_again is retried, exc


def test_agent_end():
    assert outcome_for_agent(exit_code=0, timed_out=False, budget_s=10) is None
    t = outcome_for_agent(exit_code=None, timed_out=True, budget_s=10)
    assert t.status is S.TIMEOUT and "10 s" in t.reason
    c = outcome_for_agent(exit_code=3, timed_out=False, budget_s=10, stderr_tail="boom\n")
    assert c.status is S.AGENT_ERROR and "boom" in c.reason
    e = outcome_for_agent(exit_code=1, timed_out=False, budget_s=10, engine_errors=2)
    assert e.status is S.ENGINE_ERROR
    h = outcome_for_agent(exit_code=None, timed_out=False, budget_s=1, harness_end=HarnessEnd.TIMED_OUT,
                          harness_reason="r")
    assert (h.status, h.reason) == (S.TIMEOUT, "r")
    assert outcome_for_agent(exit_code=0, timed_out=False, budget_s=1, harness_end=HarnessEnd.FINISHED) is None


# how the CLI ended (a fact the harness runner or farm's idle watch reports) -> what the rollout is
HARNESS_ENDS = {
    HarnessEnd.FINISHED: None,
    HarnessEnd.ERROR_REPORTED: S.AGENT_ERROR,
    HarnessEnd.EXITED: S.AGENT_ERROR,
    HarnessEnd.TIMED_OUT: S.TIMEOUT,
    HarnessEnd.MODEL_PATH_LOST: S.ENGINE_ERROR,
    HarnessEnd.GATEWAY_UNREACHABLE: S.ENGINE_ERROR,
    HarnessEnd.IDLE: S.AGENT_ERROR,
}


@pytest.mark.parametrize("end", list(HarnessEnd), ids=lambda e: e.value)
def test_every_harness_end_is_one_status(end):
    out = outcome_for_agent(exit_code=0, timed_out=False, budget_s=1, harness_end=end, harness_reason="why")
    assert (out.status if out is not None else None) is HARNESS_ENDS[end]
    if end in (HarnessEnd.ERROR_REPORTED, HarnessEnd.EXITED, HarnessEnd.IDLE):  # after engine errors: the engine's
        after = outcome_for_agent(exit_code=0, timed_out=False, budget_s=1, harness_end=end, engine_errors=1)
        assert after.status is S.ENGINE_ERROR


# the endings around the pipeline: what whoever saw them end reports, and what they are recorded as
ENDINGS = {
    Ending.ACTOR_LOST: S.SANDBOX_ERROR, Ending.TOO_STALE: S.STALE, Ending.HUNG: S.SANDBOX_ERROR,
    Ending.STOPPED: S.INTERRUPTED, Ending.ACTOR_FAILED: S.SANDBOX_ERROR, Ending.GIVEN_UP: S.SANDBOX_ERROR,
    Ending.ABORTED: S.ABORTED,
}


def test_every_ending_around_the_pipeline_is_one_status():
    assert set(ENDINGS) == set(Ending) - {Ending.FINISHED}
    for ending, status in ENDINGS.items():
        assert outcome_for_ending(ending, "why") == Outcome(status=status, reason="why"), ending
    with pytest.raises(ValueError):
        outcome_for_ending(Ending.FINISHED, "")


def test_breaches_endpoint_failures_and_grades():
    assert outcome_for_breaches(["memory", "pids"]) == Outcome(status=S.LIMIT_EXCEEDED, reason="memory; pids")
    assert outcome_for_endpoint(Failure.AUTH, "401").status is S.AUTH_ERROR
    assert outcome_for_endpoint("auth", "401").status is S.AUTH_ERROR  # as a transcript keeps it
    for failure in set(Failure) - {Failure.AUTH}:
        assert outcome_for_endpoint(failure.value, "x").status is S.ENGINE_ERROR, failure
    grades = {GradeStatus.RESOLVED: S.COMPLETED, GradeStatus.UNRESOLVED: S.COMPLETED,
              GradeStatus.TEST_TIMEOUT: S.COMPLETED, GradeStatus.PATCH_FAILED: S.PATCH_FAILED,
              GradeStatus.SETUP_FAILED: S.SETUP_FAILED, GradeStatus.ENV_BROKEN: S.SETUP_FAILED,
              GradeStatus.ERROR: S.SETUP_FAILED, None: S.COMPLETED}  # fmt: skip
    for verdict, status in grades.items():
        assert outcome_for_grade(verdict, "r").status is status, verdict
    assert outcome_for_grade(GradeStatus.ENV_BROKEN, "r").reason == "grading: r"


def test_a_budget_stop_is_truncated_from_what_farm_knows_not_from_the_cli():
    stop = BudgetStop(budget=Budget.CONTEXT, limit=32768, turns=7)
    clean = outcome_for_agent(exit_code=0, timed_out=False, budget_s=10, budget_stop=stop)
    assert clean == Outcome(status=S.TRUNCATED, reason="the policy ran out of its context window (32768 tokens) "
                                                        "after 7 turn(s)")  # fmt: skip
    assert clean.trainable and S.TRUNCATED.failure_class.value == "policy"
    # whatever the CLI did after the stop (an error exit, a hang, an error it reported)
    for kw in ({"exit_code": 1}, {"exit_code": None, "timed_out": True},
               {"exit_code": 0, "harness_end": HarnessEnd.ERROR_REPORTED, "harness_reason": "claude_code reported an error"}):
        out = outcome_for_agent(**{"timed_out": False, "budget_s": 10, **kw}, budget_stop=stop)
        assert out.status is S.TRUNCATED and "(then the CLI" in out.reason
    # without a stop, the same CLI error is the CLI's
    assert outcome_for_agent(exit_code=1, timed_out=False, budget_s=10).status is S.AGENT_ERROR


def test_a_truncated_rollout_after_grading():
    cut = Outcome(status=S.TRUNCATED, reason="ran out")
    assert truncated_outcome(cut, None) is cut
    assert truncated_outcome(cut, Outcome(status=S.COMPLETED)) is cut
    bad = truncated_outcome(cut, Outcome(status=S.PATCH_FAILED, reason="does not apply"))
    assert bad.status is S.TRUNCATED and bad.reason == "ran out; does not apply"
    assert truncated_outcome(cut, Outcome(status=S.SETUP_FAILED, reason="grading: x")).status is S.SETUP_FAILED


def _incomplete_tree() -> E.TaskError:
    from pathlib import Path

    from farm.tasks.repos import IncompleteTree

    return IncompleteTree(what="pvlib/pvlib-python", commit="0" * 40, repo=Path("/m"), missing=["a.h5 (6f73de)"], detail="")


def _env_build_failed() -> E.TaskError:
    from farm.envs.provider import EnvBuildFailed

    return EnvBuildFailed("environment abc failed to build (once)")


@pytest.mark.parametrize(
    "make, deterministic",
    [
        (lambda: E.RepositoryNotFound("repository getmoto/moto not found"), True),
        (lambda: E.CommitNotFound("base commit deadbeef not found"), True),
        (_incomplete_tree, True),
        (lambda: E.TaskSourceError("the task's pre_patch does not apply"), True),
        (lambda: E.RequirementUnmet("no python 3.5 on this machine"), True),
        (lambda: E.SetupCommandFailed("setup command 1/1 'exit 3' exited 3", deterministic=True), True),
        (_env_build_failed, True),
        # not known to come back: a failed clone, a timed-out or killed setup command, the sandbox
        (lambda: E.TaskError("cloning https://github.com/x/y.git failed"), False),
        (lambda: E.SetupCommandFailed("setup command 1/1 'pip install' timed out"), False),
        (lambda: E.SandboxError("bwrap died"), False),
        (lambda: E.EngineError("router down"), False),
    ],
)
def test_a_deterministic_error_makes_a_deterministic_outcome(make, deterministic):
    """The error classes carry what the retry decision needs (``FarmError.deterministic``);
    the one mapping keeps it on the outcome, whatever the phase."""
    for phase in (Phase.CREATE_SANDBOX, Phase.PREPARE):
        out = outcome_for_error(make(), phase)
        assert out.deterministic is deterministic, (out, phase)
        assert out.status.failure_class.value == "infrastructure"


def test_a_setup_step_fails_for_good_only_on_an_exit_of_its_own():
    from farm.workspace.prepare import SetupReport
    from farm.workspace.shell import CommandReport

    def report(**step) -> SetupReport:
        return SetupReport(ok=False, steps=[CommandReport(command="pip install -e .", **step)])

    assert report(exit_code=1).failed_for_good and report(exit_code=127).failed_for_good
    assert not report(exit_code=137).failed_for_good  # SIGKILL (a memory limit, the OOM killer)
    assert not report(exit_code=None, timed_out=True).failed_for_good
    assert not report(exit_code=-9).failed_for_good
    assert not SetupReport(ok=True, steps=[CommandReport(command="true", exit_code=0)]).failed_for_good
    # the disk filled: the machine's state, a later try may work (pip's, uv's, git's words)
    for said in ("OSError: [Errno 28] No space left on device", "failed to copy file: (os error 28)",
                 "fatal: unable to write new index file: No space left on device"):  # fmt: skip
        assert not report(exit_code=1, stderr_tail=said).failed_for_good, said
    assert report(exit_code=1, stdout_tail="tests of disk usage passed").failed_for_good
