"""The grading report: what the grader did and decided, travelling with the rollout.

``GradingReport`` in full goes to the rollouts table; ``summary()`` is the compact form
for Sample metadata. What its ``status`` makes of the rollout is
``farm.rollout.outcome.outcome_for_grade``'s.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.grading.config import HackAction
from farm.grading.parsers import TestIds, TestStatus
from farm.workspace.shell import CommandReport
from farm.workspace.prepare import SetupReport

PatchStrategy = Literal["empty", "git_apply", "git_apply_3way", "patch_fuzz"]
MISSING = "MISSING"  # a listed test that the run did not report (counts as failing)


class GradeStatus(str, Enum):
    RESOLVED = "resolved"  # every FAIL_TO_PASS / PASS_TO_PASS test passes (generic: reward 1)
    UNRESOLVED = "unresolved"  # graded; the patch does not solve the task
    PATCH_FAILED = "patch_failed"  # the model's diff applies with no strategy (or is too large)
    TEST_TIMEOUT = "test_timeout"  # the test command outlived its budget (reward 0)
    SETUP_FAILED = "setup_failed"  # the grading sandbox's workspace/setup failed (not the model's doing)
    ENV_BROKEN = "env_broken"  # the environment cannot run the task's tests, without the diff too (not the model's)
    ERROR = "error"  # the task cannot be graded (test patch does not apply, unknown parser, ...)


class PatchReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    strategy: PatchStrategy | None = Field(default=None, description="the strategy that applied it (None: none did)")
    bytes: int = 0
    files: list[str] = Field(default_factory=list)
    attempts: list[CommandReport] = Field(default_factory=list)
    ignored: list[str] = Field(
        default_factory=list, description="files of the diff not graded: caches tests and tools leave (__pycache__, ...)"
    )


class GradingReport(BaseModel):
    """One grading of one patch for one task."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    kind: Literal["swe", "generic"]
    status: GradeStatus
    reason: str = ""
    resolved: bool = False
    reward: float = 0.0
    patch: PatchReport = Field(default_factory=PatchReport)
    setup: SetupReport | None = None
    test: CommandReport | None = Field(default=None, description="the test command (SWE tasks)")
    test_log: str = Field(
        default="", exclude=True,
        description="the test command's whole output (stdout, then stderr): kept in the rollout's artifacts, "
        "not in the report (which keeps the ends, ``test``)",
    )
    log_parser: str | None = None
    tests: dict[str, TestStatus] = Field(default_factory=dict, description="every test status the parser found")
    fail_to_pass: dict[str, str] = Field(default_factory=dict, description="status per FAIL_TO_PASS test (or MISSING)")
    pass_to_pass: dict[str, str] = Field(default_factory=dict, description="status per PASS_TO_PASS test (or MISSING)")
    expected_mismatches: dict[str, list[str]] = Field(
        default_factory=dict, description="R2E-style: test -> [expected, got] where they differ"
    )
    verify: list[CommandReport] = Field(default_factory=list, description="verify commands (generic tasks)")
    reward_file_value: float | None = None
    timings: dict[str, float] = Field(default_factory=dict, description="seconds: prepare, apply, test, total")
    test_surface: dict[str, str] = Field(
        default_factory=dict,
        description="test-surface files the diff touched -> what the grader did ('reset: test config', ...)",
    )
    flags: list[str] = Field(default_factory=list, description="named integrity findings (diff_touches_tests, ...)")
    flag_details: dict[str, str] = Field(
        default_factory=dict, description="what raised each runtime flag: the code that did it, the tests it touched"
    )
    hack_action: HackAction | None = Field(
        default=None,
        description="what the hack findings (runtime:, static:, judge:) did, per grading.on_hack / on_static_hack: "
        "flag | zero_reward | exclude; None when there was none",
    )
    reward_before_hack_policy: float | None = Field(default=None, description="the reward a finding took away")
    probe_reaches: list[str] = Field(
        default_factory=list, exclude=True,
        description="what the probe's tripwires saw the run's code reach for (event, file, function): a "
        "grading with a diff compares its own with the run without it (``grader``); not in the report",
    )

    @property
    def excluded(self) -> bool:
        """A finding excluded this rollout from training (no Samples are written)."""
        return self.hack_action == "exclude"

    def summary(self) -> dict[str, Any]:
        """Compact, JSON-able: for Sample metadata."""
        out: dict[str, Any] = {
            "status": self.status.value,
            "resolved": self.resolved,
            "reward": self.reward,
            "patch": self.patch.strategy,
            "seconds": round(self.timings.get("total_s", 0.0), 3),
        }
        if self.fail_to_pass:
            out["f2p"] = f"{_passing(self.fail_to_pass)}/{len(self.fail_to_pass)}"
        if self.pass_to_pass:
            out["p2p"] = f"{_passing(self.pass_to_pass)}/{len(self.pass_to_pass)}"
        if self.expected_mismatches:
            out["mismatches"] = len(self.expected_mismatches)
        if self.verify:
            out["verify"] = f"{sum(c.ok for c in self.verify)}/{len(self.verify)}"
        if self.reason:
            out["reason"] = self.reason[:200]
        if self.flags:
            out["flags"] = list(self.flags)
        if self.hack_action is not None:
            out["hack_action"] = self.hack_action
        return out


def _passing(statuses: dict[str, str]) -> int:
    return sum(s in (TestStatus.PASSED.value, TestStatus.XFAIL.value) for s in statuses.values())


def unresolved_reason(f2p: dict[str, str], p2p: dict[str, str], mismatches: dict, exit_code: int, listed: bool,
                      ids: TestIds) -> str:  # fmt: skip
    """Why a grading of listed tests did not resolve: which FAIL_TO_PASS did not pass, which
    PASS_TO_PASS broke (``p2p``: the ones judged), how the statuses differ from the expected."""
    if not listed:
        return f"the test command exited {exit_code}"
    parts = []
    bad_f2p = [t for t, s in f2p.items() if s not in (TestStatus.PASSED.value, TestStatus.XFAIL.value)]
    bad_p2p = [t for t, s in p2p.items() if s not in (TestStatus.PASSED.value, TestStatus.XFAIL.value,
                                                      TestStatus.SKIPPED.value)]
    if bad_f2p:
        parts.append(f"{len(bad_f2p)}/{len(f2p)} FAIL_TO_PASS not passing (e.g. {_test_status(bad_f2p[0], f2p, ids)})")
    if bad_p2p:
        parts.append(f"{len(bad_p2p)}/{len(p2p)} PASS_TO_PASS broken (e.g. {_test_status(bad_p2p[0], p2p, ids)})")
    if mismatches:
        name = next(iter(mismatches))
        parts.append(f"{len(mismatches)} tests differ from the expected statuses (e.g. {name}: {mismatches[name]})")
    return "; ".join(parts)


def _test_status(test_id: str, statuses: dict[str, str], ids: TestIds) -> str:
    """``id: STATUS``; for a MISSING id (the run reported no such test), the closest ids it did report."""
    status = statuses[test_id]
    if status != MISSING:
        return f"{test_id}: {status}"
    if not ids.statuses:
        return f"{test_id}: {MISSING}, the run reported no tests"
    near = ids.closest(test_id)
    n = len(ids.statuses)
    return (f"{test_id}: {MISSING} (the run reported {n} test{'s' * (n != 1)}; "
            + (f"closest: {', '.join(near)})" if near else "none close to it)"))
