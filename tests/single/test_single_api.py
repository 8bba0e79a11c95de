"""farm.Rollouts end to end: the real Claude Code CLI in local sandboxes, the real
gateway, the scripted oracle behind the real router, the real reducer; five rollouts
at once from one event loop (one finalized, one aborted mid-run, one inline task, one
each with Codex and OpenCode),
and one still running when the service closes (aborted, not stored)."""

from __future__ import annotations

import asyncio
import json

import pytest

from farm.errors import TaskError
from farm.single import Rollouts
from farm.status import RolloutStatus

from single_helpers import INLINE, sandbox_left, single_config, stored_ids

pytestmark = pytest.mark.slow


async def collect(handle) -> list[dict]:
    return [ev async for ev in handle.events()]


async def test_rollouts_events_messages_abort_finalize(tmp_path):
    async with Rollouts(single_config(tmp_path)) as farm_:
        with pytest.raises(TaskError, match="unknown task 'nope'"):
            await farm_.start("nope")
        done = await farm_.start("demo-wordfreq", harness="claude_code")
        doomed = await farm_.start("demo-wordfreq", harness="claude_code")
        inline = await farm_.start(INLINE, harness="claude_code")
        others = [await farm_.start("demo-wordfreq", harness=h) for h in ("codex", "opencode")]
        assert (done.id, doomed.id) == ("demo-wordfreq.0", "demo-wordfreq.1")
        watching = asyncio.ensure_future(collect(done))

        async for ev in doomed.events():  # abort it once it is mid-run: after its first turn
            if ev["kind"] == "turn_finished":
                break
        assert doomed.state()["status"] == "running" and doomed.state()["turns"] >= 1
        assert (await doomed.messages())[-1]["role"] == "assistant"  # the live transcript, from the open session
        aborted = await doomed.abort()
        assert aborted["status"] == "aborted" and not aborted["trainable"], aborted
        result = await doomed.result()
        assert result.status is RolloutStatus.ABORTED and not RolloutStatus.ABORTED.trainable
        assert result.sandbox_id and not sandbox_left(tmp_path, result.sandbox_id)  # sandbox gone

        events = await watching
        final = await done.finalize()
        assert final["status"] == "completed" and final["reward"] == 1.0 and final["stored"], final
        kinds = [ev["kind"] for ev in events]
        assert kinds[0] == "queued" and kinds[-1] == "result"
        phases = [ev["phase"] for ev in events if ev["kind"] == "phase"]
        assert phases == ["create_sandbox", "prepare", "session", "agent", "capture", "grade"]
        finished = [ev for ev in events if ev["kind"] == "turn_finished"]
        assert finished and [ev["turn"] for ev in finished] == list(range(1, len(finished) + 1))
        assert all(ev["output_tokens"] > 0 for ev in finished)
        assert kinds.count("turn_started") == len(finished)
        assert "Bash" in [ev["name"] for ev in events if ev["kind"] == "tool_call"]
        outputs = [json.loads(ev["line"]) for ev in events if ev["kind"] == "agent_output"]
        assert outputs and outputs[-1]["type"] == "result"  # Claude Code's stream-json, to its last line
        state = done.state()
        assert state["status"] == "completed" and state["turns"] == len(finished) and state["finalized"]
        assert {k: state["tokens"][k] for k in ("prompt", "output")} == final["tokens"]  # live counts = the result's
        assert state["tokens"]["context"] == finished[-1]["prompt_tokens"]

        messages = await done.messages()  # canonical: system, user, assistant tool calls, tool results
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls", [])]
        results = [m for m in messages if m["role"] == "tool"]
        assert calls and len(results) == len(calls)
        assert {r["tool_call_id"] for r in results} == {c["id"] for c in calls}

        for other in others:  # the same canonical transcript shape whatever the CLI's wire protocol
            assert (await other.finalize())["reward"] == 1.0
            msgs = await other.messages()
            assert msgs[0]["role"] == "system" and "user" in {m["role"] for m in msgs}
            ids = {c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls", [])}
            assert ids and ids == {m["tool_call_id"] for m in msgs if m["role"] == "tool"}, other.harness

        inline_final = await inline.finalize()  # the oracle does not know it: graded by its verifier
        assert inline_final["status"] == "completed" and inline_final["reward"] == 0.5, inline_final
        assert "greeting" not in inline_final["diff"]
        assert (await doomed.finalize())["stored"] is False
        assert {s["id"]: s["status"] for s in farm_.list()} == {
            done.id: "completed", doomed.id: "aborted", inline.id: "completed",
            **{o.id: "completed" for o in others}}
        assert [s["id"] for s in farm_.list(status="aborted")] == [doomed.id]
        left = await farm_.start("demo-wordfreq")  # still running when the service closes
        async for ev in left.events():
            if ev["kind"] == "turn_started":
                break
    assert left.state()["status"] == "aborted"  # closing aborted it
    samples, rows = stored_ids(tmp_path / "out")
    assert samples == rows == {done.id, inline.id, *(o.id for o in others)}  # the aborted rollouts left nothing

