"""Bad input and a misbehaving engine: exact statuses, protocol error shapes, nothing recorded wrongly."""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
from aiohttp.client_exceptions import ClientConnectionResetError
import pytest
from gateway_helpers import Conversation, check_stream, gateway_env, parse_sse, reply_text

from farm.engine.config import FaultConfig, LatencyConfig
from farm.engine.config import EngineClientConfig
from farm.trajectory.records import TurnFlag
from testkit.waits import async_wait_until

PROTOCOLS = ["anthropic", "responses", "chat"]
FAST_CLIENT = EngineClientConfig(retries=1, backoff_s=0.0, request_timeout_s=30.0)


def _error(protocol: str, text: str) -> tuple[str, str]:
    """(error type, message) from a protocol's error JSON, checking its shape."""
    data = json.loads(text)
    if protocol == "anthropic":
        assert data["type"] == "error"
    err = data["error"]
    assert isinstance(err["message"], str) and err["message"]
    return err["type"], err["message"]


async def _ok_turn(env, protocol: str, secret: str, sid: str) -> None:
    env.script(sid, "still serving")
    body = Conversation(protocol).request()
    status, out, _ = await env.post(protocol, body, secret)
    assert status == 200, out
    check_stream(protocol, out, body)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_bad_requests(hf_tokenizer, protocol):
    async with gateway_env(hf_tokenizer, max_body_bytes=64 * 1024) as env:
        h = env.gw.open_session("s")
        body = Conversation(protocol).request()
        cases = []
        cases.append(("malformed json", dict(raw=b'{"model": "m", "messages": [', body=None), 400, None))
        cases.append(("not an object", dict(raw=b"[1, 2]", body=None), 400, None))
        cases.append(("content type", dict(body=body, headers={"Content-Type": "text/plain"}), 415, None))
        bad_tools = dict(body, tools=[{"type": "telepathy", "name": "x"}])
        cases.append(("unknown tool type", dict(body=bad_tools), 400, "telepathy"))
        key = {"anthropic": "messages", "responses": "input", "chat": "messages"}[protocol]
        cases.append(("missing messages", dict(body={k: v for k, v in body.items() if k != key}), 400, None))
        huge = dict(body, tools=body["tools"] + [{"padding": "x" * 100_000}])
        cases.append(("huge body", dict(body=huge), 413, None))
        for name, kwargs, status, needle in cases:
            got, text, _ = await env.post(protocol, kwargs.pop("body"), h.secret, **kwargs)
            assert got == status, (name, got, text)
            etype, message = _error(protocol, text)
            assert "invalid_request" in etype or etype == "request_too_large", (name, etype)
            if needle:
                assert needle in message
        # bad secrets
        for secret, expect in ((None, "missing"), ("farm-nope", "invalid")):
            got, text, _ = await env.post(protocol, body, secret)
            assert got == 401 and expect in _error(protocol, text)[1].lower()
        await _ok_turn(env, protocol, h.secret, "s")  # the server keeps serving
        await env.gw.close_session("s")
        got, text, _ = await env.post(protocol, body, h.secret)
        assert got == 401
        assert env.gw.stats("s").turns == 1


async def test_chunked_huge_body_and_unknown_routes(hf_tokenizer):
    async with gateway_env(hf_tokenizer, max_body_bytes=8 * 1024) as env:
        h = env.gw.open_session("s")

        async def chunks():
            for _ in range(64):
                yield b" " * 1024

        async with env.http.post(env.gw.base_url + "/v1/messages", data=chunks(),
                                 headers={"x-api-key": h.secret, "Content-Type": "application/json"}) as resp:
            assert resp.status == 413
            assert (await resp.json())["error"]["type"] == "request_too_large"
        async with env.http.post(env.gw.base_url + "/v1/nothing-here", json={}) as resp:
            assert resp.status == 404 and "error" in await resp.json()
        async with env.http.get(env.gw.base_url + "/v1/messages") as resp:
            assert resp.status == 405 and (await resp.json())["type"] == "error"
        body = dict(Conversation("chat").request(), n=3)
        status, text, _ = await env.post("chat", body, h.secret)
        assert status == 400 and "n: Input should be 1, got 3" in text


@pytest.mark.parametrize("protocol,status", [("anthropic", 529), ("responses", 503), ("chat", 503)])
async def test_engine_5xx_after_retries(hf_tokenizer, protocol, status):
    async with gateway_env(hf_tokenizer, faults=FaultConfig(error_rate=1.0), client=FAST_CLIENT) as env:
        h = env.gw.open_session("s")
        got, text, _ = await env.post(protocol, Conversation(protocol).request(), h.secret)
        assert got == status
        etype, message = _error(protocol, text)
        assert etype in ("overloaded_error", "server_error") and "500" in message
        assert env.worker.stats.faults["error"] == 2  # one try + one retry
        assert len(env.gw.tree("s")) == 0 and env.gw.stats("s").engine_errors == 1
        env.worker.settings.faults = FaultConfig()
        await _ok_turn(env, protocol, h.secret, "s")
        assert len(env.gw.tree("s")) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_engine_hang_times_out_and_is_aborted(hf_tokenizer, protocol):
    client = EngineClientConfig(retries=0, request_timeout_s=0.5)
    async with gateway_env(hf_tokenizer, faults=FaultConfig(hang_rate=1.0, hang_s=30), client=client) as env:
        h = env.gw.open_session("s")
        got, text, _ = await env.post(protocol, Conversation(protocol).request(), h.secret)
        assert got == 504
        assert "timed out" in _error(protocol, text)[1]
        # the hung request was aborted at the worker
        await async_wait_until(lambda: not env.worker.inflight, timeout_s=10, what="the hung request aborted")
        assert len(env.gw.tree("s")) == 0
        env.worker.settings.faults = FaultConfig()
        await _ok_turn(env, protocol, h.secret, "s")


async def test_engine_drops_mid_reply(hf_tokenizer):
    async with gateway_env(hf_tokenizer, faults=FaultConfig(drop_rate=1.0), client=FAST_CLIENT) as env:
        h = env.gw.open_session("s")
        env.script("s", "a long enough reply " * 20)
        got, text, _ = await env.post("chat", Conversation("chat").request(), h.secret)
        assert got == 503 and "cut off" in _error("chat", text)[1]
        assert env.worker.stats.faults["drop"] == 2 and len(env.gw.tree("s")) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_failure_after_stream_committed_is_an_in_stream_error(hf_tokenizer, protocol):
    latency = LatencyConfig(ttft_s=0.3)
    async with gateway_env(hf_tokenizer, faults=FaultConfig(error_rate=1.0), latency=latency,
                           client=FAST_CLIENT, first_byte_deadline_s=0.0, keepalive_s=0.05) as env:
        h = env.gw.open_session("s")
        got, text, _ = await env.post(protocol, Conversation(protocol).request(), h.secret)
        assert got == 200
        events = parse_sse(text)
        if protocol == "anthropic":
            assert events[0][0] == "message_start" and events[-1][0] == "error"
            assert events[-1][1]["error"]["type"] == "overloaded_error"
        elif protocol == "responses":
            assert events[0][0] == "response.created" and events[-1][0] == "response.failed"
            assert events[-1][1]["response"]["status"] == "failed"
        else:
            assert events[-1][1] == "[DONE]" and "error" in events[-2][1]
        assert len(env.gw.tree("s")) == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_slow_turn_streams_keepalives_then_the_reply(hf_tokenizer, protocol):
    async with gateway_env(hf_tokenizer, latency=LatencyConfig(ttft_s=0.4), first_byte_deadline_s=0.0,
                           keepalive_s=0.05) as env:
        h = env.gw.open_session("s")
        env.script("s", "slow but fine")
        body = Conversation(protocol).request()
        got, text, _ = await env.post(protocol, body, h.secret)
        assert got == 200 and text.count(": keepalive") >= 2
        check_stream(protocol, text, body)
        assert len(env.gw.tree("s")) == 1


async def test_close_session_aborts_in_flight(hf_tokenizer):
    async with gateway_env(hf_tokenizer, latency=LatencyConfig(ttft_s=30.0)) as env:
        h = env.gw.open_session("s")
        body = dict(Conversation("anthropic").request(), stream=False)
        pending = asyncio.ensure_future(env.post("anthropic", body, h.secret))
        await async_wait_until(lambda: env.worker.inflight, timeout_s=10, what="the turn in flight")
        tree = await env.gw.close_session("s")
        status, text, _ = await asyncio.wait_for(pending, 10)
        assert status == 401 and "closed" in _error("anthropic", text)[1]
        await async_wait_until(lambda: not env.worker.inflight, timeout_s=10, what="the turn aborted")
        assert len(tree) == 0
        assert env.gw.stats("s").aborted == 1


async def test_client_disconnect_aborts_generation(hf_tokenizer):
    async with gateway_env(hf_tokenizer, latency=LatencyConfig(ttft_s=30.0)) as env:
        h = env.gw.open_session("s")
        body = Conversation("chat").request()
        with pytest.raises(asyncio.TimeoutError):
            async with env.http.post(env.gw.base_url + "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {h.secret}"},
                                     timeout=aiohttp.ClientTimeout(total=0.3)) as resp:
                await resp.read()
        # the client's disconnect reaches the gateway (its abort counted) and the worker (the request dropped)
        await async_wait_until(lambda: env.gw.stats("s").aborted == 1 and not env.worker.inflight, timeout_s=10,
                               what="the turn aborted at the gateway and the worker")  # fmt: skip
        env.worker.settings.latency = LatencyConfig()
        await _ok_turn(env, "chat", h.secret, "s")
        assert len(env.gw.tree("s")) == 1


async def test_malformed_tool_call_is_text_and_flagged(hf_tokenizer):
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("s")
        env.script("s", 'Trying.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"\n</tool_call>')
        body = Conversation("anthropic").request()
        got, text, _ = await env.post("anthropic", body, h.secret)
        msg = check_stream("anthropic", text, body)
        assert got == 200 and msg["stop_reason"] == "end_turn"
        assert [b["type"] for b in msg["content"]] == ["text"] and "<tool_call>" in msg["content"][0]["text"]
        turn = env.gw.tree("s").turns[0]
        assert TurnFlag.TOOL_PARSE_ERROR in turn.flags and turn.meta["parse_errors"]
        env.script("s", reply_text("", [("Bash", {"command": "ls"})]))


async def test_a_client_leaving_mid_stream_is_not_a_gateway_error(hf_tokenizer, caplog, monkeypatch):
    """A CLI killed as its reply is written: the write raises what aiohttp raises on a closing
    transport (before it sees the connection lost and cancels the handler); logged as the client's
    leaving, not as an error with a traceback, and the gateway goes on serving."""
    caplog.set_level(logging.INFO, logger="farm.gateway")
    real_write = aiohttp.web.StreamResponse.write
    gone = {"n": 1}

    async def closing_write(self, data):
        if gone["n"]:
            gone["n"] -= 1
            raise ClientConnectionResetError("Cannot write to closing transport")
        return await real_write(self, data)

    monkeypatch.setattr(aiohttp.web.StreamResponse, "write", closing_write)
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("s")
        env.script("s", "nobody will read this")
        await env.post("chat", Conversation("chat").request(), h.secret)
        await async_wait_until(lambda: any("closed the connection during the reply" in r.getMessage()
                                           for r in caplog.records), timeout_s=10, what="the reset logged")  # fmt: skip
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
        await _ok_turn(env, "chat", h.secret, "s")
