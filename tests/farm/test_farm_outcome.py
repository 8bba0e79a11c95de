"""Every failure maps to exactly one status in one place."""

from __future__ import annotations

import asyncio

import pytest

from farm import errors as E
from farm.rollout.outcome import Phase, outcome_for_agent, outcome_for_error
from farm.status import RolloutStatus as S


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


def test_agent_end():
    assert outcome_for_agent(exit_code=0, timed_out=False, budget_s=10) is None
    t = outcome_for_agent(exit_code=None, timed_out=True, budget_s=10)
    assert t.status is S.TIMEOUT and "10 s" in t.reason
    c = outcome_for_agent(exit_code=3, timed_out=False, budget_s=10, stderr_tail="boom\n")
    assert c.status is S.AGENT_ERROR and "boom" in c.reason
    e = outcome_for_agent(exit_code=1, timed_out=False, budget_s=10, engine_errors=2)
    assert e.status is S.ENGINE_ERROR
    h = outcome_for_agent(exit_code=None, timed_out=False, budget_s=1, harness_status="timeout", harness_reason="r")
    assert (h.status, h.reason) == (S.TIMEOUT, "r")
    assert outcome_for_agent(exit_code=0, timed_out=False, budget_s=1, harness_status="completed") is None
