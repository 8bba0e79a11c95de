"""The SGLang /generate client: pooled session, routing key, retries only where safe, aborts."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket

import pytest
from aiohttp import web

from farm.engine.client import EngineClient, GenerateRequest, backoff_delay, parse_generate_reply
from farm.engine.config import FaultConfig, LatencyConfig
from farm.simulator import ScriptedPolicy, ScriptedWorker, WorkerSettings, serve_worker
from farm.errors import EngineError, EngineRejected, EngineRetryableError, EngineTimeout
from farm.engine.config import EngineClientConfig
from testkit.waits import async_wait_until

FAST = EngineClientConfig(retries=2, backoff_s=0.0, request_timeout_s=10.0)


def _req(ids, rid="r1", key="sess-1", **sp):
    return GenerateRequest(input_ids=ids, sampling_params={"max_new_tokens": 64, **sp}, rid=rid, routing_key=key)


@contextlib.asynccontextmanager
async def _worker(tok, policy, **settings):
    worker = ScriptedWorker(tok, policy, WorkerSettings(**settings))
    async with serve_worker(worker) as url:
        yield worker, url


async def test_generate_against_scripted_worker(hf_tokenizer):
    ids = hf_tokenizer.encode("hello there", add_special_tokens=False)
    async with _worker(hf_tokenizer, ScriptedPolicy(["fine thanks"])) as (worker, url):
        async with EngineClient(url, FAST) as client:
            out = await client.generate(_req(ids, skip_special_tokens=False, no_stop_trim=True))
            assert await client.health()
    expect = hf_tokenizer.encode("fine thanks", add_special_tokens=False) + [hf_tokenizer.eos_token_id]
    assert out.output_ids == expect and len(out.output_logprobs) == len(expect)
    assert out.finish_type == "stop" and out.matched == hf_tokenizer.eos_token_id
    assert out.prompt_tokens == len(ids) and out.attempts == 1
    assert dict(worker.stats.by_routing_key) == {"sess-1": 1}


async def test_length_and_4xx_are_final(hf_tokenizer):
    async with _worker(hf_tokenizer, ScriptedPolicy(["word " * 50]), context_length=64) as (worker, url):
        async with EngineClient(url, FAST) as client:
            out = await client.generate(GenerateRequest([1, 2, 3], {"max_new_tokens": 4}, rid="len"))
            assert out.finish_type == "length" and len(out.output_ids) == 4
            with pytest.raises(EngineRejected) as err:
                await client.generate(_req(list(range(5, 100))))  # over the context length: 400
            assert err.value.status == 400
            assert worker.stats.rejected == 1  # no retry of a 4xx


async def test_5xx_and_drops_are_retried(hf_tokenizer):
    async with _worker(hf_tokenizer, ScriptedPolicy(), faults=FaultConfig(error_rate=1.0)) as (worker, url):
        async with EngineClient(url, FAST) as client:
            with pytest.raises(EngineRetryableError):
                await client.generate(_req([5, 6]))
        assert worker.stats.faults["error"] == 3  # 1 + 2 retries
    async with _worker(hf_tokenizer, ScriptedPolicy(), faults=FaultConfig(drop_rate=1.0)) as (worker, url):
        async with EngineClient(url, FAST) as client:
            with pytest.raises(EngineRetryableError, match="cut off"):
                await client.generate(_req([5, 6]))
        assert worker.stats.faults["drop"] == 3
    async with _worker(hf_tokenizer, ScriptedPolicy(), faults=FaultConfig(malformed_rate=1.0)) as (worker, url):
        async with EngineClient(url, FAST) as client:
            with pytest.raises(EngineRetryableError, match="malformed reply: engine reply has no output_ids"):
                await client.generate(_req([5, 6]))
        assert worker.stats.faults["malformed"] == 3  # a 200 that is not a reply: retried like a 5xx


async def test_retry_then_success():
    calls = {"n": 0}

    async def generate(request: web.Request) -> web.Response:
        calls["n"] += 1
        if calls["n"] < 3:
            return web.json_response({"object": "error", "message": "busy"}, status=503)
        body = await request.json()
        assert request.headers["X-SMG-Routing-Key"] == "k" and body["rid"] == "r"
        return web.json_response({"output_ids": [7, 8], "meta_info": {
            "finish_reason": {"type": "stop", "matched": 8}, "prompt_tokens": 2,
            "output_token_logprobs": [[-0.1, 7, None], [-0.2, 8, None]]}})  # fmt: skip

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with EngineClient(f"http://127.0.0.1:{port}", FAST) as client:
            out = await client.generate(_req([1, 2], rid="r", key="k"))
    finally:
        await runner.cleanup()
    assert out.attempts == 3 and out.output_ids == [7, 8] and out.output_logprobs == pytest.approx([-0.1, -0.2])


async def test_connection_refused_is_retryable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with EngineClient(f"http://127.0.0.1:{port}", FAST) as client:
        with pytest.raises(EngineRetryableError):
            await client.generate(_req([1]))
        assert not await client.health()


async def test_timeout_and_cancel_abort_at_the_worker(hf_tokenizer):
    cfg = EngineClientConfig(retries=3, backoff_s=0.0, request_timeout_s=0.3)
    async with _worker(hf_tokenizer, ScriptedPolicy(), latency=LatencyConfig(ttft_s=30)) as (worker, url):
        async with EngineClient(url, cfg) as client:
            with pytest.raises(EngineTimeout):
                await client.generate(_req([1, 2], rid="slow"))
            await async_wait_until(lambda: not worker.inflight, timeout_s=10, what="the timed-out request aborted")
            task = asyncio.ensure_future(client.generate(_req([1, 2], rid="cancel-me")))
            await async_wait_until(lambda: "cancel-me" in worker.inflight, timeout_s=10, what="the request in flight")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await async_wait_until(lambda: not worker.inflight, timeout_s=10, what="the cancelled request aborted")
        with pytest.raises(EngineError):
            await client.generate(_req([1]))  # closed


def test_reply_parsing_and_backoff():
    r = parse_generate_reply({"output_ids": [1, 2], "meta_info": {"finish_reason": {"type": "length", "length": 2}}})
    assert r.finish_type == "length" and r.output_logprobs == []
    with pytest.raises(EngineError):
        parse_generate_reply({"output_ids": [1, 2], "meta_info": {"output_token_logprobs": [[-1.0, 1, None]]}})
    with pytest.raises(EngineError):
        parse_generate_reply({"text": "no ids"})
    cfg = EngineClientConfig(backoff_s=0.5, backoff_max_s=4.0)
    rng = random.Random(0)
    delays = [backoff_delay(a, cfg, rng) for a in range(1, 8)]
    assert all(0 < d <= 4.0 for d in delays) and delays[0] <= 0.5 and max(delays) > 2.0
