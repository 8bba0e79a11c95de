"""The real CLIs (pinned npm packages) in local sandboxes, against the real gateway and
the scripted ``oracle`` worker behind the real sglang-router, on a demo task. The worker
serves farm's tiny CPU model (``--model``): every token the CLI session trains on is
scored by it, and the trainer's recomputation agrees with the engine's logprobs.

One worker + router for the module; a gateway per test (in the test's event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from farm.engine.client import EngineClient
from farm.engine.config import RouterConfig
from farm.engine.launchers import start_router, start_scripted_worker
from farm.gateway.config import GatewayConfig
from farm.gateway.gateway import Gateway
from farm.harnesses import make_harness
from farm.harnesses.base import HarnessRun
from farm.harnesses.config import HarnessConfig
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import DEFAULT_PATH, LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import open_sandbox
from farm.sandboxes.local import sandbox_pids
from farm.harnesses.plan import HarnessEnd
from farm.workspace.capture import capture_diff
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks, resolve_tasks_path
from farm.tasks.runtime import TaskRuntime
from farm.trajectory.linearize import RolloutInfo, linearize
from farm.workspace.prepare import prepare_workspace

from harness_testutil import free_port

pytestmark = pytest.mark.slow

TASK_ID = "demo-romans"
CLIS = ["claude_code", "codex", "opencode"]


@pytest.fixture(scope="module")
def model_dir(hf_tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from farm.simulator.lm import new_model, save_model

    return save_model(new_model(len(hf_tokenizer), seed=3), tmp_path_factory.mktemp("model") / "v0")


@pytest.fixture(scope="module")
def stack(tokenizer_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(router URL, task runtime, the demo task): an oracle worker with a model behind the real router."""
    tasks_cfg = TasksConfig(path="demo", cache_dir=str(tmp_path_factory.getbasetemp() / "farm-tasks-cache"))
    tasks_path = resolve_tasks_path(tasks_cfg)
    runtime = TaskRuntime.from_config(tasks_cfg)
    task = load_tasks(tasks_cfg).by_id()[TASK_ID]
    log_dir = tmp_path_factory.mktemp("harness-engine")

    async def start():
        worker = await start_scripted_worker(
            {"policy": "oracle", "tokenizer": str(tokenizer_dir), "tasks_path": str(tasks_path),
             "model_path": str(model_dir)},
            log_dir=log_dir, name="oracle-0", timeout=120,
        )  # fmt: skip
        try:
            router = await start_router([worker[1]], RouterConfig(), log_dir=log_dir)
        except BaseException:
            await worker[0].astop()
            raise
        return worker, router

    (worker, _), (router, router_url) = asyncio.run(start())
    yield router_url, runtime, task
    router.stop()
    worker.stop()


@pytest.fixture
async def gateway(stack, hf_tokenizer):
    router_url = stack[0]
    cfg = GatewayConfig()
    async with contextlib.AsyncExitStack() as es:
        engine = await es.enter_async_context(EngineClient(router_url, cfg.engine_client))
        yield await es.enter_async_context(Gateway(cfg, hf_tokenizer, engine, "hermes"))


@pytest.fixture
async def workspace_sandbox(stack, tmp_path: Path):
    _, runtime, task = stack
    cfg = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb")))
    async with open_sandbox(cfg, SandboxSpec(labels={"run_id": "harness-e2e"})) as sb:
        ws = await prepare_workspace(sb, task, runtime)
        yield sb, ws


def task_env(stack) -> dict[str, str]:
    prefix = stack[1].path_prefix or str(Path(sys.executable).parent)
    return {"PATH": f"{prefix}:{DEFAULT_PATH}"}


def extends(tree, turn) -> bool:
    """Append-only: the turn's prompt starts with its parent's full sequence (prompt + output)."""
    parent = tree.get(turn.parent_id)
    seq = tree.sequence_ids(parent.turn_id)
    prompt = tree.prompt_ids(turn.turn_id)
    return len(prompt) > len(seq) and np.array_equal(prompt[: len(seq)], seq)


@pytest.mark.parametrize("name", CLIS)
async def test_real_cli_solves_a_demo_task(name, stack, gateway, workspace_sandbox, model_dir) -> None:
    _, _, task = stack
    sb, ws = workspace_sandbox
    session = f"{name}-{uuid.uuid4().hex[:8]}"
    handle = gateway.open_session(session)
    harness = make_harness(HarnessConfig(name=name))
    run = HarnessRun(
        instruction=task.instruction, gateway_url=gateway.base_url, api_key=handle.secret,
        model="farm-policy", workdir=ws.workdir, budget_s=240, env=task_env(stack),
    )  # fmt: skip
    result = await harness.run(sb, run)
    tree = await gateway.close_session(session)

    assert result.end is HarnessEnd.FINISHED, (result.reason, result.stderr_tail[-2000:])
    assert result.exit_code == 0 and result.events
    assert "passed" in (result.final_message or "")  # the agent ran the tests itself, and they passed
    assert not sandbox_pids(sb.id)  # nothing of the CLI is left running

    diff = await capture_diff(sb, ws, exclude=result.diff_excludes)
    assert diff.files == ["romans/__init__.py"]  # the fix only: nothing farm or the CLI wrote
    check = await sb.exec(task.test_command, cwd=ws.workdir, env=task_env(stack), timeout=120)
    assert check.exit_code == 0, check.stdout[-2000:]

    turns = tree.turns
    chained = [t for t in turns if t.parent_id is not None and extends(tree, t)]
    assert len(chained) >= 2, [(t.turn_id, t.parent_id, sorted(f.value for f in t.flags)) for t in turns]
    assert all(extends(tree, t) for t in turns if t.parent_id is not None)
    # The oracle's first step is two parallel shell calls; the CLI ran both and answered both.
    parallel = [t for t in turns if len((t.response or {}).get("tool_calls") or []) >= 2]
    assert parallel, "no turn with parallel tool calls"
    call_ids = {c["id"] for c in parallel[0].response["tool_calls"]}
    answers = [
        m.get("tool_call_id")
        for child in tree.children(parallel[0].turn_id)
        for m in child.messages
        if m.get("role") == "tool"
    ]
    assert call_ids <= set(answers)

    # The trainer recomputes every trained token with the served weights: the engine's logprobs agree.
    from farm.simulator.agreement import logprob_agreement
    from farm.simulator.lm import load_model

    samples = linearize(tree, RolloutInfo(rollout_id=session, reward=1.0))
    agree = logprob_agreement(samples, lambda version: load_model(model_dir))
    assert agree.tokens == sum(int(s.loss_mask.sum()) for s in samples) > 0
    assert agree.max_abs <= 1e-4, agree


@pytest.mark.parametrize("name", CLIS)
async def test_real_cli_ends_cleanly_when_the_turn_budget_runs_out(name, stack, gateway, workspace_sandbox) -> None:
    """One turn allowed: the oracle's first turn (two parallel looks) runs, the CLI sends
    their results, the gateway ends the session (farm.gateway.budget): each CLI takes
    that end of turn as a final answer and exits 0, not 1 as on a length stop."""
    sb, ws = workspace_sandbox
    session = f"{name}-budget-{uuid.uuid4().hex[:8]}"
    handle = gateway.open_session(session, max_turns=1)
    harness = make_harness(HarnessConfig(name=name))
    run = HarnessRun(
        instruction=stack[2].instruction, gateway_url=gateway.base_url, api_key=handle.secret,
        model="farm-policy", workdir=ws.workdir, budget_s=240, env=task_env(stack),
    )  # fmt: skip
    result = await harness.run(sb, run)
    tree = await gateway.close_session(session)
    assert result.end is HarnessEnd.FINISHED and result.exit_code == 0, (result.reason,
                                                                               result.stderr_tail[-2000:])
    assert "Stopping here: the turn budget (max_turns = 1) is spent." in (result.final_message or "")
    stop = tree.budget_stop
    assert stop is not None and (stop.budget.value, stop.limit, stop.turns) == ("max_turns", 1, 1)
    assert gateway.stats(session).after_budget_stop == 0  # the CLI asked nothing more
    assert not sandbox_pids(sb.id)


async def test_real_cli_over_budget_is_killed(stack, gateway, workspace_sandbox) -> None:
    """OpenCode needs seconds just to start: a 1 s budget is exceeded, the tree is killed."""
    sb, ws = workspace_sandbox
    handle = gateway.open_session("budget")
    harness = make_harness(HarnessConfig(name="opencode"))
    run = HarnessRun(
        instruction=stack[2].instruction, gateway_url=gateway.base_url, api_key=handle.secret,
        model="farm-policy", workdir=ws.workdir, budget_s=1.0, env=task_env(stack),
    )  # fmt: skip
    result = await harness.run(sb, run)
    await gateway.close_session("budget")
    assert result.end is HarnessEnd.TIMED_OUT and result.timed_out
    assert result.exit_code is None and "budget" in result.reason
    assert not sandbox_pids(sb.id)


async def test_real_cli_crash_is_agent_error(stack, gateway, workspace_sandbox) -> None:
    """Codex refuses the removed chat wire API at startup: exit 1, the reason on stderr."""
    sb, ws = workspace_sandbox
    handle = gateway.open_session("crash")
    harness = make_harness(HarnessConfig(name="codex", extra_args=["-c", 'model_providers.farm.wire_api="chat"']))
    run = HarnessRun(
        instruction=stack[2].instruction, gateway_url=gateway.base_url, api_key=handle.secret,
        model="farm-policy", workdir=ws.workdir, budget_s=60,
    )  # fmt: skip
    result = await harness.run(sb, run)
    tree = await gateway.close_session("crash")
    assert result.end is HarnessEnd.EXITED
    assert result.exit_code not in (0, None)
    assert "wire_api" in result.stderr_tail and result.reason.startswith("codex exited")
    assert len(tree.turns) == 0


async def test_real_cli_gateway_unreachable(stack, workspace_sandbox) -> None:
    sb, ws = workspace_sandbox
    harness = make_harness(HarnessConfig(name="claude_code", probe_timeout_s=2))
    run = HarnessRun(
        instruction=stack[2].instruction, gateway_url=f"http://127.0.0.1:{free_port()}", api_key="x",
        model="farm-policy", workdir=ws.workdir, budget_s=600,
    )  # fmt: skip
    result = await asyncio.wait_for(harness.run(sb, run), 60)
    assert result.end is HarnessEnd.GATEWAY_UNREACHABLE
    assert "unreachable" in result.reason and result.exit_code is None


async def test_real_cli_stuck_on_a_closed_session(stack, gateway, workspace_sandbox) -> None:
    """A closed session answers 401; Claude Code retries that with backoff for minutes.
    The watchdog sees the retry loop in its stream and stops it."""
    sb, ws = workspace_sandbox
    handle = gateway.open_session("closed")
    await gateway.close_session("closed")
    harness = make_harness(HarnessConfig(name="claude_code", watch_interval_s=0.5, max_client_retries=2))
    run = HarnessRun(
        instruction=stack[2].instruction, gateway_url=gateway.base_url, api_key=handle.secret,
        model="farm-policy", workdir=ws.workdir, budget_s=600,
    )  # fmt: skip
    result = await asyncio.wait_for(harness.run(sb, run), 120)
    assert result.end is HarnessEnd.MODEL_PATH_LOST
    assert "stuck retrying" in result.reason and "401" in result.reason
    assert not sandbox_pids(sb.id)
