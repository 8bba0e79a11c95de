"""`farm serve --openenv` driven by OpenEnv's own MCP client (openenv-core's
MCPToolClient, over its WebSocket protocol): 4 rollouts at once, one followed through
subscribe_events, one aborted mid-run (aborted, sandbox gone, no Sample), the rest
finalized; run_rollout in one call; the token in the URL is the credential. (The same
server under 8 at once: test_single_http.py; here the protocol is what is new.)"""

from __future__ import annotations

import signal

import pytest
from openenv.core.mcp_client import MCPToolClient

from farm.single.mcp_env import TOOLS
from single_helpers import INLINE, serve, stored_ids
from testkit.waits import async_wait_until

pytestmark = pytest.mark.slow

TOKEN = "openenv-token-456"


@pytest.fixture
def server(tmp_path):
    with serve(tmp_path, TOKEN, "--openenv") as running:
        yield running


async def follow(env, rid: str, until: str = "result") -> list[dict]:
    events, since = [], 0
    while True:
        got = await env.call_tool("subscribe_events", rollout_id=rid, since=since, wait_s=10)
        assert [e["seq"] for e in got["events"]] == list(range(since + 1, got["next"] + 1))  # in order, none doubled
        events += got["events"]
        since = got["next"]
        if got["done"] or any(e["kind"] == until for e in got["events"]):
            return events


async def test_openenv_client_drives_the_farm(server, tmp_path):
    url, proc = server
    assert url.endswith("/" + TOKEN)
    with pytest.raises(ConnectionError):  # no token in the path: nothing there
        async with MCPToolClient(base_url=url.rsplit("/", 1)[0]) as env:
            await env.list_tools()

    async with MCPToolClient(base_url=url, message_timeout_s=600) as env:
        assert set(TOOLS) <= {t.name for t in await env.list_tools()}
        with pytest.raises(RuntimeError, match="unknown task 'nope'"):
            await env.call_tool("start_rollout", task="nope")
        with pytest.raises(RuntimeError, match="unknown rollout 'nope'"):
            await env.call_tool("get_state", rollout_id="nope")

        ids = [(await env.call_tool("start_rollout", task="demo-wordfreq", harness="claude_code"))["id"]
               for _ in range(4)]
        assert len(set(ids)) == 4
        watched, doomed, rest = ids[0], ids[1], ids[2:]

        await follow(env, doomed, until="turn_finished")  # mid-run
        aborted = await env.call_tool("abort_rollout", rollout_id=doomed)
        assert aborted["status"] == "aborted", aborted
        sandbox = tmp_path / "sb" / "single" / aborted["sandbox_id"]
        assert aborted["sandbox_id"]
        await async_wait_until(lambda: not sandbox.exists(), timeout_s=10, what="the aborted rollout's sandbox removed")

        events = await follow(env, watched)
        kinds = [e["kind"] for e in events]
        assert kinds[0] == "queued" and "turn_finished" in kinds and "tool_call" in kinds
        assert events[-1]["kind"] == "result" and events[-1]["status"] == "completed"
        state = await env.call_tool("get_state", rollout_id=watched)
        assert state["status"] == "completed" and state["turns"] == kinds.count("turn_finished")
        messages = await env.call_tool("get_messages", rollout_id=watched)
        assert messages[0]["role"] == "system" and any(m["role"] == "tool" for m in messages)

        for rid in [watched, *rest]:
            final = await env.call_tool("finalize_rollout", rollout_id=rid)
            assert final["status"] == "completed" and final["reward"] == 1.0 and final["stored"], final
        assert (await env.call_tool("finalize_rollout", rollout_id=doomed))["stored"] is False

        one = await env.call_tool("run_rollout", inline=INLINE)  # start, wait, finalize in one call
        assert one["status"] == "completed" and one["reward"] == 0.5 and one["stored"], one

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    assert not (tmp_path / "out").exists()  # the config file's output.dir is farm run's: beside it
    samples, rows = stored_ids(tmp_path / "rollouts")
    assert samples == rows == {watched, *rest, one["id"]}
