"""`farm serve`'s HTTP app, fast (aiohttp's test server around a real farm.Rollouts whose
agent only sleeps): /health answers without a token; an event stream resumes after the
event named by `?since=N` or `Last-Event-ID: N` alike (SSE semantics: N is the last event
the client has)."""

from __future__ import annotations

import json

from aiohttp.test_utils import TestClient, TestServer

from farm.single import Rollouts
from farm.single.http import make_app
from farm.tasks.model import Task

from single_helpers import SleepParts, single_config

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _seqs(client: TestClient, url: str, headers: dict[str, str] | None = None) -> list[int]:
    res = await client.get(url, headers={**AUTH, **(headers or {})})
    assert res.status == 200 and res.content_type == "text/event-stream", await res.text()
    ids, seqs = [], []
    text = (await res.text()).strip()
    for block in text.split("\n\n") if text else []:
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        ids.append(int(fields["id"]))
        seqs.append(json.loads(fields["data"])["seq"])
    assert ids == seqs
    return seqs


async def test_health_and_event_resumption(tmp_path):
    task = Task(id="t", instruction="sleep", verify_commands=["true"], metadata={"agent_s": 0.1})
    service = Rollouts(single_config(tmp_path), tasks=[task], parts_factory=SleepParts)
    async with service, TestClient(TestServer(make_app(service, TOKEN), host="127.0.0.1")) as client:
        res = await client.get("/health")  # no token: a liveness probe carries none
        assert res.status == 200 and await res.json() == {"status": "ok"}
        assert (await client.get("/rollouts")).status == 401  # everything else still needs it
        res = await client.post("/rollouts", json={"task": "t"}, headers=AUTH)
        rid = (await res.json())["id"]
        await service.get(rid).wait()
        every = await _seqs(client, f"/rollouts/{rid}/events")
        assert every == list(range(1, len(every) + 1)) and len(every) >= 3  # numbered from 1
        assert await _seqs(client, f"/rollouts/{rid}/events?since=0") == every
        assert await _seqs(client, f"/rollouts/{rid}/events?since=2") == every[2:]  # after event 2
        assert await _seqs(client, f"/rollouts/{rid}/events", {"Last-Event-ID": "2"}) == every[2:]  # the same
        # a reconnecting EventSource keeps its URL and sends the header: the header wins
        assert await _seqs(client, f"/rollouts/{rid}/events?since=1", {"Last-Event-ID": "3"}) == every[3:]
        assert await _seqs(client, f"/rollouts/{rid}/events?since={every[-1]}") == []  # has the result: ends at once
        for bad in ("?since=x", "?since=-1"):
            res = await client.get(f"/rollouts/{rid}/events{bad}", headers=AUTH)
            assert res.status == 400 and "since must be" in (await res.json())["error"]["message"]
        polled = await service.get(rid).poll(2)  # the Python API and OpenEnv's long poll count the same way
        assert [e["seq"] for e in polled] == every[2:]
    res_app = make_app(service, TOKEN)  # closed: the probe says so
    async with TestClient(TestServer(res_app, host="127.0.0.1")) as client:
        res = await client.get("/health")
        assert res.status == 503 and await res.json() == {"status": "stopped"}
