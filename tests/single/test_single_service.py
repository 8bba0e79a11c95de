"""farm.Rollouts' own bookkeeping, fast: real local sandboxes and the real pipeline and
reducer, an agent that only sleeps (no engine, no CLI)."""

from __future__ import annotations

import asyncio

import pytest

from farm.errors import ConfigError
from farm.single import Rollouts
from farm.tasks.model import Task

from single_helpers import SleepParts, single_config, stored_ids
from testkit.waits import async_wait_until


def task(tid: str, agent_s: float) -> Task:
    return Task(id=tid, instruction="sleep", verify_commands=["true"], metadata={"agent_s": agent_s})


async def test_queued_abort_many_readers_and_poll(tmp_path):
    cfg = single_config(tmp_path, concurrency=1)
    tasks = [task("fast", 0.1), task("slow", 30)]
    async with Rollouts(cfg, tasks=tasks, parts_factory=SleepParts) as service:
        with pytest.raises(ConfigError, match="unknown harness 'vim'"):
            await service.start("fast", harness="vim")
        slow = await service.start("slow")
        queued = await service.start("fast")  # one slot: waits behind 'slow'
        readers = [asyncio.ensure_future(_kinds(queued)) for _ in range(3)]
        await async_wait_until(lambda: slow.state()["phase"] != "queued", what="'slow' took the one slot")
        assert queued.state()["phase"] == "queued" and await queued.poll(1, wait_s=0.2) == []
        result = await queued.abort()
        assert result["status"] == "aborted" and "while queued" in result["reason"]
        assert await asyncio.gather(*readers) == [["queued", "result"]] * 3  # every reader saw the same log
        first = await slow.poll(0, wait_s=1)
        assert [e["kind"] for e in first][:2] == ["queued", "phase"]
        assert (await slow.abort())["status"] == "aborted"
        kept = await slow.finalize(keep_aborted=True)  # asked for: its row is written, untrainable
        assert kept["stored"] and not kept["trainable"]
        again = await service.start("fast")  # a fresh id: aborted ids are not reused
        assert again.id == "fast.1" and (await again.finalize())["status"] == "completed"
        assert (await queued.finalize())["stored"] is False
    assert stored_ids(tmp_path / "out")[1] == {"fast.1", "slow.0"}  # rows (this agent has no turns: no Samples)
    assert _statuses(tmp_path / "out") == {"fast.1": "completed", "slow.0": "aborted"}


async def test_a_failure_outside_the_pipeline_ends_the_rollout(tmp_path, monkeypatch):
    from farm.actors.sandbox import SandboxActor

    async def broken(self, spec, observer=None):
        raise RuntimeError("actor bug")

    monkeypatch.setattr(SandboxActor, "execute", broken)
    async with Rollouts(single_config(tmp_path), tasks=[task("fast", 0.1)], parts_factory=SleepParts) as service:
        handle = await service.start("fast")
        result = await asyncio.wait_for(handle.result(), 10)
        assert result.status.value == "sandbox_error" and "actor bug" in result.reason
        assert handle.state()["status"] == "sandbox_error"


async def _kinds(handle) -> list[str]:
    return [ev["kind"] async for ev in handle.events()]


def _statuses(out_dir) -> dict[str, str]:
    from farm.output.writer import ROLLOUTS_TABLE
    from farm.output.shard_reader import ShardReader

    rows = ShardReader(out_dir, name=ROLLOUTS_TABLE).read_table().to_pylist()
    return {r["rollout_id"]: r["status"] for r in rows}


async def test_an_infrastructure_failure_is_recorded_as_it_ended(tmp_path, monkeypatch):
    """No reruns in a single service (its caller starts another rollout if it wants one): a
    sandbox failure is finalized into its rollouts row, not handed back for a rerun nobody runs."""
    from farm.actors.sandbox import SandboxActor
    from farm.status import RolloutStatus

    original = SandboxActor.execute

    async def failing(self, spec, observer=None):
        result = await original(self, spec, observer)
        result.status, result.reason = RolloutStatus.SANDBOX_ERROR, "injected sandbox failure"
        return result

    monkeypatch.setattr(SandboxActor, "execute", failing)
    async with Rollouts(single_config(tmp_path), tasks=[task("fast", 0.1)], parts_factory=SleepParts) as service:
        handle = await service.start("fast")
        finalized = await asyncio.wait_for(handle.finalize(), 30)
        assert finalized["status"] == "sandbox_error" and finalized["stored"], finalized
    assert _statuses(tmp_path / "out") == {"fast.0": "sandbox_error"}

async def test_a_rollout_ended_outside_the_pipeline_keeps_its_identity():
    """A handle's own result (the actor failed; aborted while queued) carries the spec's
    attempt and group index and the runner's model, as the pipeline's results do."""
    from farm.rollout.model import RolloutSpec, Runner
    from farm.single.handle import RolloutHandle

    spec = RolloutSpec(run_id="r", rollout_id="t.0", group_id="t", sample_index=0, task=task("t", 0.1),
                       attempt=2, group_index=5)  # fmt: skip

    async def nothing(*_):
        return []

    handle = RolloutHandle(spec, Runner("claude_code", model="policy-m"), live_transcript=nothing, store=nothing,
                           outputs={})  # fmt: skip

    async def broken():
        raise RuntimeError("actor bug")

    handle.attach(asyncio.ensure_future(broken()))
    result = await asyncio.wait_for(handle.result(), 10)
    assert result.status.value == "sandbox_error" and "actor bug" in result.reason
    assert (result.attempt, result.group_index, result.model, result.harness) == (2, 5, "policy-m", "claude_code")
