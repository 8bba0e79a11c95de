"""The real sglang-router binary over scripted worker processes (``farm engine serve``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

import numpy as np
from engine_helpers import live_pids
from farm.engine.routing import MoEShape, fake_routing
from farm.engine.client import EngineClient, GenerateRequest
from farm.engine.config import FaultConfig, LatencyConfig, RouterConfig
from farm.engine.launchers import router_argv, start_router, start_scripted_worker
from farm.errors import EngineRetryableError
from farm.engine.config import EngineClientConfig

pytestmark = pytest.mark.slow
ROUTER_MOE = MoEShape(layers=3, top_k=2, experts=20)


async def start_farm(tok_path: str, log_dir: Path, n: int = 2, **worker_kwargs):
    kwargs = {"policy": "noop", "tokenizer": tok_path, **worker_kwargs}
    started = await asyncio.gather(*(start_scripted_worker(kwargs, log_dir=log_dir, name=f"w{i}", timeout=60)
                                     for i in range(n)))
    router, url = await start_router([u for _, u in started], RouterConfig(), log_dir=log_dir)
    return router, url, started


def stop_all(router, started) -> None:
    pids = [router.pid] + [p.pid for p, _ in started]
    router.stop()
    for p, _ in started:
        p.stop()
    assert not live_pids(pids)


@pytest.fixture(scope="module")
def farm2(tok_path, tmp_path_factory):
    """Two noop workers (simulating a small MoE) behind the router (shared by the read-only tests)."""
    router, url, started = asyncio.run(start_farm(tok_path, tmp_path_factory.mktemp("farm2"), moe=ROUTER_MOE))
    yield url, [u for _, u in started]
    stop_all(router, started)


async def post(session, url, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["X-SMG-Routing-Key"] = key
    async with session.post(url + "/generate", json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_same_routing_key_sticks_to_one_worker(farm2):
    url, workers = farm2
    keys = [f"session-{i}" for i in range(12)]
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            results = await asyncio.gather(*(post(s, url, {"text": f"hi {k}", "sampling_params": {"max_new_tokens": 4}}, k)
                                             for k in keys))
            assert all(status == 200 for status, _ in results)
        stats = []
        for w in workers:
            async with s.get(w + "/farm/stats") as r:
                stats.append((await r.json())["by_routing_key"])
    for k in keys:
        holders = [st[k] for st in stats if k in st]
        assert holders == [3], (k, stats)  # all three requests of a key on exactly one worker
    assert all(stats), "both workers serve sessions"


async def test_router_forwards_weight_version_and_flush(farm2):
    url, workers = farm2
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/flush_cache") as r:
            assert r.status == 200
        async with s.get(url + "/workers") as r:
            listed = {w["url"] for w in (await r.json())["workers"]}
    assert listed == set(workers)


async def test_routed_experts_behind_the_real_router(farm2):
    """sglang-router 0.3.2 re-serializes /generate bodies and drops return_routed_experts /
    routed_experts_start_len (the worker never sees them, so no routed_experts come back):
    the client sends routed-experts requests straight to the worker the session's key maps
    to, found through the router's /workers. If a router release passes them, the first
    assertion fails and the direct path can go."""
    url, workers = farm2
    ids = list(range(5, 25))
    async with aiohttp.ClientSession() as s:
        status, body = await post(s, url, {"input_ids": ids, "return_routed_experts": True,
                                           "routed_experts_start_len": 12, "sampling_params": {"max_new_tokens": 4}})
    assert status == 200 and "routed_experts" not in body["meta_info"]  # stripped by the router
    async with EngineClient(url, EngineClientConfig(routed_experts=ROUTER_MOE)) as engine:
        res = await engine.generate(GenerateRequest(input_ids=ids, sampling_params={"max_new_tokens": 6},
                                                    rid="moe-1", routing_key="moe", routed_experts_start_len=12))
        seq = np.asarray(ids + res.output_ids, dtype=np.int64)
        assert res.routed_start == 12 and res.routed_experts.shape == (len(seq) - 1 - 12, 3, 2)
        assert np.array_equal(res.routed_experts.astype(np.int32), fake_routing(seq, 12, len(seq) - 1, ROUTER_MOE))
        same = [await engine.generate(GenerateRequest(input_ids=ids, sampling_params={"max_new_tokens": 2},
                                                      rid=f"moe-{i}", routing_key="moe", routed_experts_start_len=0))
                for i in range(3)]
        assert all(r.routed_experts is not None for r in same)
    async with aiohttp.ClientSession() as s:  # the session stayed on one worker
        counts = []
        for w in workers:
            async with s.get(w + "/farm/stats") as r:
                counts.append((await r.json())["by_routing_key"].get("moe", 0))
    assert sorted(counts) == [0, 4]


async def test_killing_a_worker_mid_run_loses_no_request(tok_path, tmp_path):
    router, url, started = await start_farm(tok_path, tmp_path, latency=LatencyConfig(ttft_s=0.3, tokens_per_s=200))
    try:
        async with aiohttp.ClientSession() as s:
            body = {"text": "hello", "sampling_params": {"max_new_tokens": 20}}
            tasks = [asyncio.create_task(post(s, url, body, f"k{i}")) for i in range(16)]
            await asyncio.sleep(0.15)  # all in flight
            victim, _ = started[0]
            victim.kill()
            results = await asyncio.gather(*tasks)
            again = await asyncio.gather(*(post(s, url, body, f"k{i}") for i in range(16)))
        for status, out in results + again:
            assert status == 200
            assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 20}
        assert not live_pids([victim.pid])
    finally:
        stop_all(router, started)


async def test_dropped_reply_is_retryable_in_gateway_client(tok_path, tmp_path):
    router, url, started = await start_farm(tok_path, tmp_path, n=1, faults=FaultConfig(drop_rate=1.0))
    worker_url = started[0][1]
    req = GenerateRequest(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 8}, rid="d1", routing_key="s")
    try:
        # Through the router: it retries the cut reply, then gives up with a 5xx.
        async with EngineClient(url, EngineClientConfig(retries=0)) as client:
            with pytest.raises(EngineRetryableError):
                await client.generate(req)
        # Straight from the worker: the body stops mid-way.
        async with EngineClient(worker_url, EngineClientConfig(retries=1)) as client:
            with pytest.raises(EngineRetryableError, match="cut off"):
                await client.generate(req)
        # A stream cut mid-way reaches the client as a broken body (the router does not retry it).
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientPayloadError):
                async with s.post(url + "/generate", json={"input_ids": [5, 6], "stream": True},
                                  headers={"Content-Type": "application/json"}) as r:
                    await r.read()
            async with s.get(worker_url + "/farm/stats") as r:
                assert (await r.json())["faults"]["drop"] >= 3
    finally:
        stop_all(router, started)


def test_router_command_uses_session_affinity_and_sane_timeouts():
    argv = router_argv(["http://a:1", "http://b:2"], RouterConfig(), port=30001, prometheus_port=30002)
    joined = " ".join(argv)
    assert argv[1:3] == ["-m", "sglang_router.launch_router"]
    assert "--worker-urls http://a:1 http://b:2" in joined
    assert "--policy manual" in joined
    assert "--cb-timeout-duration-secs 5" in joined
    assert "--prometheus-port 30002" in joined and "--port 30001" in joined
    assert "--request-timeout-secs 900" in joined and "--health-check-interval-secs 5" in joined


def test_farm_engine_serve_cli(tok_path, tmp_path):
    """``python -m farm engine serve`` answers /generate and exits cleanly on SIGTERM."""
    from farm.engine.launchers import scripted_worker_argv
    from farm.engine.processes import ManagedProcess

    ready = tmp_path / "ready"
    argv = scripted_worker_argv(policy="scripted", tokenizer=tok_path, ready_file=str(ready))
    proc = ManagedProcess("cli", argv, log_path=tmp_path / "cli.log")
    proc.start()

    async def go():
        from farm.engine.processes import read_ready_file, wait_until

        async def is_ready():
            return read_ready_file(ready) is not None

        await wait_until(is_ready, timeout=60, what="ready file", proc=proc)
        async with aiohttp.ClientSession() as s:
            return await post(s, read_ready_file(ready), {"text": "hi"})

    try:
        status, out = asyncio.run(go())
        assert status == 200 and out["text"] == "OK."
    finally:
        assert proc.stop() == 0, proc.log_tail()
    assert "scripted worker" in proc.log_tail()
    json.dumps(out)
