"""One rollout, end to end, without Ray.

create sandbox -> prepare workspace -> open gateway session -> install / configure /
launch the harness -> wait within budget -> capture the diff -> close the session ->
close the sandbox -> grade in a FRESH sandbox -> RolloutResult.

Every rollout ends with exactly one status: phases raise, and ``farm.rollout.outcome``
maps what they raise (or how the agent ended) to a status + reason, in one place. The
session is always closed (its tree is kept even for failed rollouts) and every
sandbox is always closed, also on timeout and cancellation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

from farm.gateway.endpoints import RolloutMode
from farm.output.artifacts import RolloutArtifacts, build_artifacts, turns_jsonl
from farm.output.config import ArtifactsConfig
from farm.rollout.model import RolloutResult, RolloutSpec, Runner
from farm.grading.config import HackAction
from farm.grading.report import GradeStatus
from farm.harnesses.plan import HarnessEnd
from farm.rollout.outcome import (
    OnTruncated,
    Phase,
    final_answer_given,
    grades_truncated,
    outcome_for_agent,
    outcome_for_breaches,
    outcome_for_endpoint,
    outcome_for_error,
    outcome_for_grade,
    outcome_for_timeout,
    truncated_outcome,
)
from farm.output.rows import counts_of
from farm.sandboxes.base import Sandbox
from farm.status import FailureClass, Outcome, RolloutStatus

if TYPE_CHECKING:
    from farm.harnesses.plan import HarnessResult

log = logging.getLogger(__name__)


@dataclass
class AgentEnd:
    """How the agent CLI ended, in the pipeline's terms: one type whatever ended it (the
    harness run returned, farm found the CLI stuck, the hosted endpoint failed the session)."""

    exit_code: int | None
    timed_out: bool = False
    stderr_tail: str = ""
    log_tail: str = ""
    stdout: str = ""  # the whole streams, for the rollout's artifacts
    stderr: str = ""
    end: HarnessEnd | None = None  # how the CLI ended, where farm saw it end (the harness runner, the idle watch)
    reason: str = ""
    failure: tuple[str, str] | None = None  # (Failure, reason): the hosted endpoint failed the session
    diff_excludes: list[str] = field(default_factory=list)  # files farm wrote in the workdir: not the agent's diff

    @classmethod
    def from_harness(cls, result: HarnessResult) -> AgentEnd:
        return cls(exit_code=result.exit_code, timed_out=result.timed_out, stderr_tail=result.stderr_tail,
                   log_tail=result.stdout_tail, stdout=result.stdout, stderr=result.stderr,
                   end=result.end, reason=result.reason,
                   diff_excludes=list(result.diff_excludes))  # fmt: skip

    @classmethod
    def stuck(cls, reason: str) -> AgentEnd:
        """Farm found the CLI stuck and killed it."""
        return cls(exit_code=None, end=HarnessEnd.IDLE, reason=reason)

    @classmethod
    def endpoint_failed(cls, failure: str, reason: str) -> AgentEnd:
        """The hosted endpoint failed the session for good (black-box, ``failure``: its
        ``farm.gateway.hosted.Failure``): the CLI was killed."""
        return cls(exit_code=None, reason=reason, failure=(failure, reason))


@dataclass
class Grade:
    reward: float
    report: dict[str, Any] | None
    verdict: GradeStatus | None = None  # the grader's (its report's status); None: a stand-in grader's, graded
    reason: str = ""
    hack_action: HackAction | None = None  # what a hack finding did (grading.on_hack): None when there was none
    summary: dict[str, Any] | None = None  # compact report for Sample metadata
    test_log: str = ""  # the test command's whole output (artifacts)


class RolloutParts(Protocol):
    """What the pipeline needs from the layers below (``farm.rollout.actor_layers`` wires the real ones)."""

    async def create_sandbox(self, spec: RolloutSpec, purpose: str) -> Sandbox: ...

    async def prepare(self, sandbox: Sandbox, spec: RolloutSpec) -> Any:
        """Returns the prepared workspace (opaque here; handed to run_agent and capture)."""

    async def open_session(self, spec: RolloutSpec) -> str: ...

    async def run_agent(
        self, sandbox: Sandbox, spec: RolloutSpec, secret: str, budget_s: float, workspace: Any
    ) -> AgentEnd: ...

    async def capture(self, sandbox: Sandbox, spec: RolloutSpec, workspace: Any) -> str: ...

    async def close_session(self, secret: str) -> Any: ...

    async def grade(self, spec: RolloutSpec, diff: str) -> Grade: ...


@dataclass
class _State:
    phase: Phase = Phase.CREATE_SANDBOX
    sandbox: Sandbox | None = None
    secret: str | None = None
    key: str = ""  # the session's key, kept to redact it from every text the rollout keeps
    tree: Any = None
    diff: str = ""
    log_tail: str = ""
    run: AgentEnd | None = None
    setup: Any = None  # the workspace's setup report (a pydantic model), for the artifacts
    traceback: str = ""
    grade: Grade | None = None
    timings: dict[str, float] = field(default_factory=dict)
    phase_t0: float = 0.0
    observer: Callable[[str, dict[str, Any]], None] | None = None  # hears each phase change (farm.single)

    def enter(self, phase: Phase) -> None:
        now = time.monotonic()
        if self.phase_t0:
            self.timings[self.phase.value] = self.timings.get(self.phase.value, 0.0) + now - self.phase_t0
        changed = phase is not self.phase or not self.phase_t0
        self.phase, self.phase_t0 = phase, now
        if changed and self.observer is not None:
            try:
                self.observer("phase", {"phase": phase.value})
            except Exception:  # noqa: BLE001 - an observer's bug never fails a rollout
                log.exception("rollout observer failed")

    def leave(self) -> None:
        self.enter(self.phase)
        self.phase_t0 = 0.0


REDACTED = "<redacted:session-key>"


def _redact(text: str, key: str) -> str:
    """farm never writes a session key outside its sandbox (an agent may print its own)."""
    return text.replace(key, REDACTED) if key and key in text else text


def _redact_json(value: Any, key: str) -> Any:
    if not key or value is None:
        return value
    dumped = json.dumps(value)
    return json.loads(dumped.replace(key, REDACTED)) if key in dumped else value


def _observed(task: asyncio.Future) -> None:
    """A background close's failure is reported where the close is awaited (_cleanup)."""
    if not task.cancelled():
        task.exception()


def _breaches(sandbox: Sandbox | None) -> list[str]:
    return list(sandbox.breaches) if sandbox is not None else []


def _limit_exceeded(sandbox: Sandbox | None) -> Outcome:
    return outcome_for_breaches(_breaches(sandbox))


def _policy_of(sandbox: Sandbox | None) -> dict[str, str]:
    """The agent sandbox's network and limits policy and the environment snapshot it
    started from (farm.envs), for the record."""
    if sandbox is None:
        return {}
    policy = {"env_key": sandbox.view.key} if sandbox.view is not None else {}
    for items, prefix in ((sandbox.network_policy, "network_"), (sandbox.limits_policy, "limits_")):
        policy.update({prefix + key: str(value) for key, value in items.items()})
    return policy


class RolloutPipeline:
    def __init__(
        self,
        parts: RolloutParts,
        *,
        harness: str,
        model: str = "",
        timeout_s: float,
        agent_timeout_s: float | None = None,
        actor: str = "",
        artifacts: ArtifactsConfig | None = None,
        mode: RolloutMode = RolloutMode.TOKEN_EXACT,
        node: str = "",
        on_truncated: OnTruncated = "grade",
    ) -> None:
        self.on_truncated = on_truncated
        self.parts = parts
        # mode black_box: a hosted endpoint serves the CLI (its record a Transcript, never Samples)
        self.runner = Runner(harness=harness, model=model, mode=mode, actor=actor, node=node)
        self.timeout_s = timeout_s
        self.agent_timeout_s = agent_timeout_s
        self.artifacts = artifacts

    async def run(
        self, spec: RolloutSpec, observer: Callable[[str, dict[str, Any]], None] | None = None
    ) -> RolloutResult:
        """Run one rollout. Never raises for a rollout failure (cancellation included).
        ``observer(kind, data)`` hears every phase change."""
        started = time.time()
        state = _State(observer=observer)
        state.enter(Phase.CREATE_SANDBOX)
        outcome: Outcome
        try:
            async with asyncio.timeout(self.timeout_s):
                outcome = await self._phases(spec, state)
        except TimeoutError:
            reason = f"rollout exceeded {self.timeout_s:g} s (during {state.phase.value})"
            outcome = outcome_for_timeout(state.phase, reason)
        except asyncio.CancelledError:
            outcome = outcome_for_error(asyncio.CancelledError(), state.phase)
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        except Exception as exc:  # noqa: BLE001 - the one place a failure becomes a status
            outcome = outcome_for_error(exc, state.phase)
            state.traceback = traceback.format_exc()
            report = getattr(exc, "report", None)  # SetupCommandFailed carries its setup report
            if state.setup is None and hasattr(report, "model_dump"):
                state.setup = report
            if outcome.reason.startswith("internal error"):
                log.exception("rollout %s: internal error in %s", spec.rollout_id, state.phase.value)
        finally:
            await self._cleanup(spec, state)
        if outcome.status is RolloutStatus.TIMEOUT and final_answer_given(state.tree):
            # the policy had finished: the CLI (or farm) failed to end, never the policy's timeout
            outcome = outcome_for_timeout(Phase.AGENT, outcome.reason, final_answer_given=True)
        state.leave()
        grade = state.grade
        graded = outcome.status in (RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED)
        graded_as = outcome_for_grade(grade.verdict, grade.reason) if grade is not None else None
        reward = grade.reward if graded_as is not None and graded and graded_as.status is RolloutStatus.COMPLETED else 0.0
        finished = time.time()
        state.timings["total"] = finished - started
        result = RolloutResult.of(
            spec,
            self.runner,
            outcome.model_copy(update={"reason": _redact(outcome.reason, state.key)}),
            started_at=started,
            finished_at=finished,
            reward=reward,
            grading=_redact_json(grade.report, state.key) if grade is not None else None,
            grading_summary=grade.summary if grade is not None else None,
            hack_action=grade.hack_action if grade is not None else None,
            diff=_redact(state.diff, state.key),
            agent_log_tail=_redact(state.log_tail, state.key),
            counts=counts_of(state.tree),
            timings={k: round(v, 4) for k, v in state.timings.items()},
            sandbox_id=state.sandbox.id if state.sandbox is not None else "",
            sandbox_policy=_policy_of(state.sandbox),
            tree=state.tree,
        )
        if self.artifacts is not None and self.artifacts.enabled:
            result.artifacts = self._artifacts(result, state, spec)
        return result

    def _artifacts(self, result: RolloutResult, st: _State, spec: RolloutSpec) -> RolloutArtifacts:
        """The rollout's files, redacted and capped (the reducer writes them if it records it)."""
        run, grade = st.run, st.grade
        error = ""
        if result.status.failure_class is FailureClass.INFRASTRUCTURE or st.traceback:
            error = f"status: {result.status.value}\nphase: {st.phase.value}\nreason: {result.reason}\n"
            error += f"\n{st.traceback}" if st.traceback else ""
        texts = {
            "agent.stdout": run.stdout if run is not None else "",
            "agent.stderr": run.stderr if run is not None else "",
            "turns.jsonl": turns_jsonl(st.tree),
            "diff.patch": st.diff,
            "grading.json": json.dumps(grade.report, indent=1) if grade is not None and grade.report else "",
            "test.log": grade.test_log if grade is not None else "",
            "setup.json": st.setup.model_dump_json(indent=1) if st.setup is not None else "",
            "error.txt": error,
            "task.json": spec.task.model_dump_json(indent=1),
        }
        index = {"task_id": result.task_id, "attempt": result.attempt, "status": result.status.value,
                 "reason": result.reason, "harness": result.harness, "timings": result.timings}  # fmt: skip
        assert self.artifacts is not None
        return build_artifacts(result.rollout_id, texts, cap=self.artifacts.max_bytes_per_rollout,
                               redact=lambda t: _redact(t, st.key), index=index)  # fmt: skip

    async def _phases(self, spec: RolloutSpec, st: _State) -> Outcome:
        p = self.parts
        st.sandbox = await p.create_sandbox(spec, "agent")
        st.enter(Phase.PREPARE)
        workspace = await p.prepare(st.sandbox, spec)
        st.setup = getattr(workspace, "setup", None)
        st.enter(Phase.SESSION)
        st.secret = await p.open_session(spec)
        st.key = st.secret
        st.enter(Phase.AGENT)
        budget = self.agent_timeout_s or spec.task.timeouts.agent_s
        try:
            run = await p.run_agent(st.sandbox, spec, st.secret, budget, workspace)
        except Exception:
            if _breaches(st.sandbox):  # the limit killed the agent: a policy outcome, not a crash
                return _limit_exceeded(st.sandbox)
            raise
        st.log_tail, st.run = run.log_tail, run
        if _breaches(st.sandbox):
            # Over a limit (memory, pids, disk, lifetime): reward 0, no diff, no grading.
            st.tree = await p.close_session(st.secret)
            st.secret = None
            return _limit_exceeded(st.sandbox)
        st.enter(Phase.CAPTURE)
        # the session first: its socket goes with it, so the capture's command starts no relay
        # to it in the jail (farm.sandboxes.local_net)
        st.tree = await p.close_session(st.secret)
        st.secret = None
        st.diff = await p.capture(st.sandbox, spec, workspace)
        # Torn down (processes, view, directory: ~0.3 s, seconds under load) while grading runs;
        # _cleanup awaits the same close (idempotent) and logs a failure. Kept for its id.
        asyncio.ensure_future(st.sandbox.close()).add_done_callback(_observed)
        failure = (st.tree.failure if st.tree is not None else None) or run.failure  # a TurnTree's is always None
        if failure is not None:  # a hosted endpoint failed the session (farm.gateway.blackbox): never graded
            return outcome_for_endpoint(*failure)
        agent_end = outcome_for_agent(
            exit_code=run.exit_code,
            timed_out=run.timed_out,
            budget_s=budget,
            stderr_tail=run.stderr_tail,
            engine_errors=counts_of(st.tree).engine_errors,
            harness_end=run.end,
            harness_reason=run.reason,
            budget_stop=st.tree.budget_stop if st.tree is not None else None,
        )
        truncated = agent_end is not None and agent_end.status is RolloutStatus.TRUNCATED
        if agent_end is not None and (not truncated or not grades_truncated(self.on_truncated)):
            return agent_end
        st.enter(Phase.GRADE)  # a truncated rollout's diff is graded as it stands
        st.grade = await p.grade(spec, st.diff)
        graded = outcome_for_grade(st.grade.verdict, st.grade.reason)
        return truncated_outcome(agent_end, graded) if agent_end is not None else graded

    async def _cleanup(self, spec: RolloutSpec, st: _State) -> None:
        """Close the session (keep its tree) and the sandbox, whatever happened."""
        if st.secret is not None:
            try:
                st.tree = await self.parts.close_session(st.secret)
            except Exception:  # noqa: BLE001 - cleanup must go on; the status is already decided
                log.exception("rollout %s: closing the gateway session failed", spec.rollout_id)
            st.secret = None
        if st.sandbox is not None:
            try:
                await st.sandbox.close()
            except Exception:  # noqa: BLE001
                log.exception("rollout %s: closing sandbox %s failed", spec.rollout_id, st.sandbox.id)
