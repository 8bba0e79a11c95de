"""`farm serve` over real HTTP (a subprocess, aiohttp client): 8 rollouts at once (real
Claude Code, local sandboxes, the scripted oracle), one streamed over SSE, one aborted
mid-run (status aborted, its sandbox gone within 5 s, no Sample), the rest finalized;
bad requests get clear 4xx JSON errors."""

from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
import pytest

from single_helpers import serve, stored_ids
from testkit.waits import async_wait_until

pytestmark = pytest.mark.slow

TOKEN = "test-token-123"


@pytest.fixture
def server(tmp_path):
    with serve(tmp_path, TOKEN) as running:
        yield running


async def sse(session, url: str, *, until: str = "result"):
    """The events of one rollout's SSE stream, parsed, up to the first ``until``."""
    out = []
    async with session.get(url) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        event: dict = {}
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("id: "):
                event["id"] = int(line[4:])
            elif line.startswith("event: "):
                event["event"] = line[7:]
            elif line.startswith("data: "):
                event["data"] = json.loads(line[6:])
            elif not line and event:
                assert event["id"] == event["data"]["seq"] and event["event"] == event["data"]["kind"]
                out.append(event["data"])
                if event["event"] == until:
                    return out
                event = {}
    return out


async def test_serve_eight_rollouts_stream_abort_finalize(server, tmp_path):
    url, proc = server
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(url) as anon, aiohttp.ClientSession(url, headers=auth) as http:
        async with anon.get("/rollouts") as r:
            assert r.status == 401 and (await r.json())["error"]["type"] == "authentication"
        for body, status, needle in [
            ({"task": "nope"}, 400, "unknown task 'nope'"),
            ({}, 400, "exactly one of"),
            ({"task": "demo-wordfreq", "harness": "vim"}, 400, "unknown harness"),
            ({"task": "demo-wordfreq", "extra": 1}, 400, "unknown field"),
            ({"inline": {"instruction": "x"}}, 400, "verifier"),
            ([1, 2], 400, "JSON object"),
        ]:
            async with http.post("/rollouts", json=body) as r:
                assert r.status == status and needle in (await r.json())["error"]["message"], (body, r.status)
        async with http.post("/rollouts", data="{", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_json"
        async with http.post("/rollouts", data="task=x") as r:
            assert r.status == 415
        for path in ("/rollouts/nope", "/rollouts/nope/events", "/rollouts/nope/messages"):
            async with http.get(path) as r:
                assert r.status == 404 and "unknown rollout 'nope'" in (await r.json())["error"]["message"]
        async with http.post("/rollouts/nope/abort") as r:
            assert r.status == 404

        async def start() -> str:
            async with http.post("/rollouts", json={"task": "demo-wordfreq", "harness": "claude_code"}) as r:
                assert r.status == 201, await r.text()
                return (await r.json())["id"]

        ids = await asyncio.gather(*(start() for _ in range(8)))
        assert len(set(ids)) == 8
        watched, doomed, rest = ids[0], ids[1], ids[2:]
        streaming = asyncio.ensure_future(sse(http, f"/rollouts/{watched}/events"))

        await sse(http, f"/rollouts/{doomed}/events", until="turn_finished")  # mid-run
        async with http.post(f"/rollouts/{doomed}/abort") as r:
            aborted = await r.json()
        assert r.status == 200 and aborted["status"] == "aborted", aborted
        sandbox = tmp_path / "sb" / "single" / aborted["sandbox_id"]
        assert aborted["sandbox_id"]
        await async_wait_until(lambda: not sandbox.exists(), timeout_s=10, what="the aborted rollout's sandbox removed")
        async with http.post(f"/rollouts/{doomed}/finalize") as r:
            assert (await r.json())["stored"] is False

        events = await streaming
        kinds = [e["kind"] for e in events]
        assert kinds[0] == "queued" and "turn_finished" in kinds and kinds[-1] == "result"
        assert events[-1]["status"] == "completed"
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        resumed = await sse(http, f"/rollouts/{watched}/events?since={len(events) - 1}")
        assert [e["seq"] for e in resumed] == [len(events)]  # a reconnect resumes after its last event

        async def finalize(rid: str) -> dict:
            async with http.post(f"/rollouts/{rid}/finalize") as r:
                assert r.status == 200
                return await r.json()

        finals = await asyncio.gather(*(finalize(rid) for rid in [watched, *rest]))
        assert all(f["status"] == "completed" and f["reward"] == 1.0 and f["stored"] for f in finals), finals
        async with http.get(f"/rollouts/{watched}/messages") as r:
            msgs = (await r.json())["messages"]
        assert msgs[0]["role"] == "system" and any(m["role"] == "tool" for m in msgs)
        async with http.get("/rollouts", params={"status": "aborted"}) as r:
            assert [s["id"] for s in (await r.json())["rollouts"]] == [doomed]
        async with http.get(f"/rollouts/{watched}") as r:
            got = await r.json()
            assert got["status"] == "completed" and got["finalized"] and got["result"]["reward"] == 1.0

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    assert not (tmp_path / "out").exists()  # the config file's output.dir is farm run's: beside it
    samples, rows = stored_ids(tmp_path / "rollouts")
    assert samples == rows == {watched, *rest}
