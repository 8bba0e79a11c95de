"""The rollout pipeline with real LocalSandboxes: one status per rollout, always cleaned up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farm import errors as E
from farm.rollout.model import RolloutSpec
from farm.rollout.pipeline import AgentEnd, Grade, RolloutPipeline
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.status import RolloutStatus as S
from farm.tasks.model import Task
from farm.trajectory.records import Budget, BudgetStop
from farm.trajectory.transcript import Transcript
from farm.trajectory.tree import TurnTree
from testkit.waits import async_wait_until


class Parts:
    """Real sandboxes and processes; the failure of each phase is chosen by the test."""

    def __init__(self, base: Path, **fail) -> None:
        self.cfg = SandboxConfig.model_validate({"local": {"base_dir": str(base)}})
        self.fail = fail
        self.sandboxes = []
        self.sessions_open: set[str] = set()
        self.graded = 0

    async def create_sandbox(self, spec, purpose):
        if self.fail.get("create"):
            raise E.SandboxError("backend down")
        sb = await create_sandbox(self.cfg, SandboxSpec(labels={"run_id": spec.run_id, "rollout_id": spec.rollout_id}))
        self.sandboxes.append(sb)
        return sb

    async def prepare(self, sb, spec):
        res = await sb.exec(self.fail.get("setup_cmd", "mkdir -p repo && echo hi > repo/f"), timeout=self.fail.get("setup_timeout", 30))
        if not res.ok:
            raise E.SetupError(f"setup exited {res.exit_code}")

    async def open_session(self, spec):
        self.sessions_open.add(spec.rollout_id)
        return spec.rollout_id

    async def run_agent(self, sb, spec, secret, budget_s, workspace):
        proc = await sb.start(self.fail.get("agent_cmd", "echo change >> repo/f"))
        try:
            res = await proc.wait(timeout=budget_s)
        except E.SandboxTimeout:
            return AgentEnd(exit_code=None, timed_out=True)
        return AgentEnd(exit_code=res.exit_code, stderr_tail=res.stderr, log_tail=res.stdout)

    async def capture(self, sb, spec, workspace):
        return (await sb.read_file(f"{sb.root}/repo/f")).decode()

    async def close_session(self, secret):
        self.sessions_open.discard(secret)
        if self.fail.get("endpoint"):  # black-box: the hosted endpoint failed the session for good
            transcript = Transcript(secret, "ep")
            transcript.failure = self.fail["endpoint"]
            return transcript
        # two turns; the policy's last one is a tool call still running, unless the test says it had answered
        call = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "sleep 60"}}}]}
        tree = TurnTree(secret)
        first = tree.append(parent_id=None, prompt_delta_ids=[10, 11, 12], output_ids=[100, 101],
                            output_logprobs=[-0.5, -0.25], finish_reason="stop", response=call)
        tree.append(parent_id=first.turn_id, prompt_delta_ids=[7, 8], output_ids=[101, 102], output_logprobs=[-0.5, -0.25],
                    finish_reason="stop", response=None if self.fail.get("final_answer") else call)
        if self.fail.get("budget_stop"):  # the gateway ended the session: the policy ran out of turns
            tree.budget_stop = BudgetStop(budget=Budget.MAX_TURNS, limit=2, turns=2)
        return tree

    async def grade(self, spec, diff):
        self.graded += 1
        if self.fail.get("grade"):
            raise self.fail["grade"]
        return Grade(reward=1.0 if "change" in diff else 0.0, report={"resolved": "change" in diff},
                     hack_action=self.fail.get("hack_action"))


def _spec(agent_s: float = 30.0) -> RolloutSpec:
    task = Task(id="t", instruction="do it", timeouts={"agent_s": agent_s})
    return RolloutSpec(run_id="pipe", rollout_id="t.0", group_id="t", sample_index=0, task=task)


async def _run(tmp_path, *, timeout_s=60.0, agent_s=30.0, on_truncated="grade", **fail):
    parts = Parts(tmp_path, **fail)
    pipe = RolloutPipeline(parts, harness="claude_code", model="m", timeout_s=timeout_s, actor="a0",
                           on_truncated=on_truncated)  # fmt: skip
    result = await pipe.run(_spec(agent_s))
    assert all(sb.closed for sb in parts.sandboxes)
    assert not parts.sessions_open
    assert not any((tmp_path / "pipe").iterdir()) if (tmp_path / "pipe").exists() else True
    return result, parts


async def test_completed(tmp_path):
    r, parts = await _run(tmp_path)
    assert (r.status, r.reward, r.reason) == (S.COMPLETED, 1.0, "")
    assert r.diff == "hi\nchange\n" and r.grading == {"resolved": True}
    assert r.counts.turns == 2 and r.counts.output_tokens == 4 and r.tree is not None
    assert r.sandbox_id == parts.sandboxes[0].id and r.actor == "a0"
    assert {"create_sandbox", "prepare", "session", "agent", "capture", "grade", "total"} <= set(r.timings)


async def test_the_hack_verdict_travels_typed_with_the_result(tmp_path):
    r, _ = await _run(tmp_path, hack_action="exclude")
    assert r.status is S.COMPLETED and r.hack_action == "exclude"
    r, _ = await _run(tmp_path)
    assert r.hack_action is None


@pytest.mark.parametrize(
    "fail, status, needle",
    [
        ({"create": True}, S.SANDBOX_ERROR, "backend down"),
        ({"setup_cmd": "exit 3"}, S.SETUP_FAILED, "exited 3"),
        ({"setup_cmd": "sleep 30", "setup_timeout": 0.5}, S.SETUP_FAILED, "timed out"),
        ({"agent_cmd": "echo boom >&2; exit 7"}, S.AGENT_ERROR, "boom"),
        ({"grade": E.PatchApplyError("does not apply")}, S.PATCH_FAILED, "does not apply"),
        ({"grade": E.GradingError("pytest missing")}, S.GRADING_ERROR, "grader"),
        ({"endpoint": ("auth", "hosted endpoint failed (auth): 401")}, S.AUTH_ERROR, "401"),
        ({"endpoint": ("server", "hosted endpoint failed (server): 500")}, S.ENGINE_ERROR, "500"),
    ],
)
async def test_each_failure_is_one_status(tmp_path, fail, status, needle):
    r, parts = await _run(tmp_path, **fail)
    assert r.status is status and needle in r.reason and r.reward == 0.0
    if "setup_cmd" in fail or "create" in fail:
        assert r.tree is None and r.counts.turns == 0
    if "agent_cmd" in fail:
        assert r.counts.turns == 2 and parts.graded == 0  # tree kept, not graded
    if "endpoint" in fail:  # infrastructure: never graded, never a reward-0 policy outcome
        assert parts.graded == 0 and r.tree.failure == fail["endpoint"]


async def test_agent_budget_and_whole_rollout_timeout(tmp_path):
    r, _ = await _run(tmp_path, agent_cmd="sleep 60", agent_s=0.5)
    assert r.status is S.TIMEOUT and "0.5 s" in r.reason
    r, _ = await _run(tmp_path, agent_cmd="sleep 60", timeout_s=1.0)
    assert r.status is S.TIMEOUT and "during agent" in r.reason and r.counts.turns == 2
    # the policy had given its final answer and the CLI still did not end: not the policy's timeout
    r, _ = await _run(tmp_path, agent_cmd="sleep 60", timeout_s=1.0, final_answer=True)
    assert r.status is S.AGENT_ERROR and "after the policy's final answer" in r.reason
    assert not r.status.trainable
    r, _ = await _run(tmp_path, agent_cmd="sleep 60", agent_s=0.5, final_answer=True)
    assert r.status is S.AGENT_ERROR


@pytest.mark.parametrize("on_truncated, reward, graded", [("grade", 1.0, 1), ("zero", 0.0, 0), ("exclude", 1.0, 1)])
async def test_a_budget_stop_is_truncated_at_once_and_graded_as_rollout_on_truncated_says(
        tmp_path, on_truncated, reward, graded):
    r, parts = await _run(tmp_path, budget_stop=True, on_truncated=on_truncated)
    assert r.status is S.TRUNCATED and r.status.trainable and "turn budget (max_turns = 2)" in r.reason
    assert (r.reward, parts.graded) == (reward, graded) and r.diff == "hi\nchange\n"
    assert (r.grading is not None) is bool(graded)


async def test_a_budget_stop_is_truncated_whatever_the_cli_did_after_it(tmp_path):
    # farm knows the gateway ended the session; the CLI's own exit is only named
    r, parts = await _run(tmp_path, budget_stop=True, agent_cmd="echo change >> repo/f; echo oops >&2; exit 1")
    assert r.status is S.TRUNCATED and "then the CLI" in r.reason and "exited 1" in r.reason
    assert r.reward == 1.0 and parts.graded == 1
    r, _ = await _run(tmp_path, budget_stop=True, agent_cmd="sleep 60", agent_s=0.5)
    assert r.status is S.TRUNCATED and "did not end within 0.5 s" in r.reason
    # the grader's own failure stays infrastructure (retried), never a truncated reward 0
    r, _ = await _run(tmp_path, budget_stop=True, grade=E.GradingError("pytest missing"))
    assert r.status is S.GRADING_ERROR


async def test_cancel_cleans_up(tmp_path):
    parts = Parts(tmp_path, agent_cmd="sleep 60")
    pipe = RolloutPipeline(parts, harness="claude_code", timeout_s=60)
    task = asyncio.create_task(pipe.run(_spec()))
    await async_wait_until(lambda: parts.sessions_open, timeout_s=30, what="the agent's gateway session open")
    await asyncio.sleep(0.3)  # the agent runs a while before the cancel
    task.cancel()
    r = await task
    assert r.status is S.CANCELLED and "agent" in r.reason
    assert all(sb.closed for sb in parts.sandboxes) and not parts.sessions_open


async def test_grading_does_not_wait_for_the_agent_sandbox_teardown(tmp_path) -> None:
    """The agent sandbox is torn down (view, directory) while its diff is graded, and the
    rollout still ends with it closed."""
    parts = Parts(tmp_path, final_answer=True)
    seen: list[bool] = []
    grade = parts.grade

    async def grading(spec, diff):
        seen.append(parts.sandboxes[0].dir.exists())  # being torn down, not gone yet
        return await grade(spec, diff)

    parts.grade = grading
    result = await RolloutPipeline(parts, harness="claude_code", model="m", timeout_s=60, actor="a0").run(_spec())
    assert result.status is S.COMPLETED and result.reward == 1.0
    assert seen == [True]
    assert parts.sandboxes[0].closed and not parts.sandboxes[0].dir.exists()


@pytest.mark.parametrize("error, recorded", [(KeyError("turn"), True), (E.GradingError("pytest missing"), False)],
                         ids=["a bug in farm", "an infrastructure failure"])
async def test_a_bug_in_the_pipeline_is_recorded_at_once_by_the_reducer(tmp_path, error, recorded):
    """What the reducer (the one that decides a retry) makes of a real pipeline's result: a bug
    in farm inside a phase would meet the same code on a rerun, so it is recorded on its first
    attempt; an infrastructure failure is handed back to run again."""
    from farm.actors.reducer import ReducerActor
    from farm.config import FarmConfig

    r, _ = await _run(tmp_path / "run", grade=error)
    cfg = FarmConfig.model_validate({"run_id": "pipe", "output": {"dir": str(tmp_path / "out")},
                                     "ray": {"reducer_flush_s": 0.05}})  # fmt: skip
    red = ReducerActor(cfg, metrics=False)
    try:
        summary = await red.submit(r)
    finally:
        await red.close()
    assert summary.durable is recorded, summary
    if recorded:
        assert summary.status is S.SANDBOX_ERROR and "internal error during grade: KeyError" in summary.reason
    else:
        assert summary.status is S.GRADING_ERROR and summary.retry.runs_again and summary.retry.kind.value == "infrastructure"
