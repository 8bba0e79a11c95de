"""Bounds on a request's work and on what its tool history claims (farm.gateway.bounds):
each refusal is a 4xx in the protocol's shape, records nothing, never reaches the
engine, and the session keeps serving."""

from __future__ import annotations

import json

import pytest
from gateway_helpers import Conversation, gateway_env, reply_text

from farm.gateway.config import GatewayConfig
from farm.gateway.render import PromptRenderer, PromptTooLong, bounded_chars

PROTOCOLS = ["anthropic", "responses", "chat"]


def _message(text: str) -> str:
    data = json.loads(text)
    return data["error"]["message"]


async def _refused(env, protocol: str, body, secret: str, status: int, needle: str) -> str:
    got, text, _ = await env.post(protocol, body, secret)
    assert got == status, (got, text[:300])
    message = _message(text)
    assert needle in message, message
    return message


async def _still_serves(env, protocol: str, secret: str, sid: str) -> None:
    env.script(sid, "still serving")
    got, text, _ = await env.post(protocol, Conversation(protocol).request(), secret)
    assert got == 200, text[:300]


def test_the_default_body_limit_follows_the_context_limit():
    assert GatewayConfig().body_limit == 32 * 131072  # 4 MiB
    assert GatewayConfig(max_context_tokens=8192).body_limit == 1 << 20  # never under 1 MiB
    assert GatewayConfig(max_context_tokens=8192, max_body_bytes=5000).body_limit == 5000


def test_the_token_floor_never_overestimates(hf_tokenizer):
    renderer = PromptRenderer(hf_tokenizer)
    assert renderer.max_token_chars
    longest = max(len(renderer.decode([i])) for i in range(len(hf_tokenizer)))
    assert longest <= renderer.max_token_chars


def test_counting_stops_as_soon_as_the_count_passes_the_limit(hf_tokenizer):
    renderer = PromptRenderer(hf_tokenizer)
    encoded: list[int] = []
    real_encode = renderer.encode
    renderer.encode = lambda text: encoded.append(len(text)) or real_encode(text)  # type: ignore[method-assign]
    limit = 30_000
    text = "a b c d e f g h\n" * 25_000  # 400K chars, ~1.1 chars per token: far over, though its floor is not
    assert renderer.token_floor(len(text)) <= limit < len(real_encode(text))
    with pytest.raises(PromptTooLong, match="counted past the limit"):
        renderer.check_length(text, limit)
    assert sum(encoded) < len(text) // 3, "tokenized far more than needed to know it is over"
    # the floor alone decides a text no tokenization could fit
    encoded.clear()
    with pytest.raises(PromptTooLong, match="at least"):
        renderer.check_length("x" * 2_000_000, limit)
    assert not encoded
    # long but fitting (12 characters a token): no refusal
    fits = "<|im_start|>" * 20_000
    assert len(fits) > bounded_chars(limit) and len(real_encode(fits)) <= limit
    renderer.check_length(fits, limit)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_prompt_that_cannot_fit_is_refused_before_the_engine(hf_tokenizer, protocol):
    async with gateway_env(hf_tokenizer, max_context_tokens=4096, max_body_bytes=16 << 20) as env:
        h = env.gw.open_session("s")
        # a 3 MB task: its length alone proves it cannot fit (the request-level floor)
        await _refused(env, protocol, Conversation(protocol, task="x" * 3_000_000).request(), h.secret, 400,
                       "characters of messages are at least 18")
        # 200K characters at ~2 a token: the floor allows it, the chunked count refuses it
        d = env.gw.open_session("d", max_context_tokens=20_000)
        many = "a b c d\n" * 25_000
        await _refused(env, protocol, Conversation(protocol, task=many).request(), d.secret, 400,
                       "counted past the limit")
        # the same appended to a live conversation: the delta is bounded the same way
        conv = Conversation(protocol)
        env.script("d", reply_text("", [("bash", {"command": "ls"})]))
        got, text, _ = await env.post(protocol, conv.request(), d.secret)
        assert got == 200, text[:300]
        conv.echo(_reply(protocol, text), [many])
        await _refused(env, protocol, conv.request(), d.secret, 400, "counted past the limit")
        assert env.gw.stats("s").too_long_refusals == 1 and len(env.gw.tree("s")) == 0
        assert env.gw.stats("d").too_long_refusals == 2 and len(env.gw.tree("d")) == 1
        assert not _engine_prompts(env, "s") and len(_engine_prompts(env, "d")) == 1
        await _still_serves(env, protocol, h.secret, "s")


def _engine_prompts(env, sid: str) -> list[list[int]]:
    return [list(r.input_ids) for r in env.policy.requests if r.routing_key == sid]


def _reply(protocol: str, text: str) -> dict:
    from gateway_helpers import check_stream

    return check_stream(protocol, text, Conversation(protocol).request())


def _forge(protocol: str, body: dict, *, call_id: str, arguments, result_id: str) -> dict:
    """An assistant tool call with ``arguments`` and a tool result for ``result_id``."""
    if protocol == "anthropic":
        body["messages"] += [{"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "bash",
                                                                "input": arguments}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": result_id,
                                                           "content": "ok"}]}]  # fmt: skip
    elif protocol == "responses":
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        body["input"] += [{"type": "function_call", "call_id": call_id, "name": "bash", "arguments": args},
                          {"type": "function_call_output", "call_id": result_id, "output": "ok"}]
    else:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        body["messages"] += [{"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": args}}]},
            {"role": "tool", "tool_call_id": result_id, "content": "ok"}]
    return body


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_tool_history_that_contradicts_itself_is_refused(hf_tokenizer, protocol):
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("s")
        ok = {"command": "ls"}
        forged = _forge(protocol, Conversation(protocol).request(), call_id="c1", arguments=ok, result_id="c9")
        await _refused(env, protocol, forged, h.secret, 400, "unknown tool call id 'c9'")
        non_object = "[1, 2]" if protocol != "anthropic" else "rm -rf /"
        forged = _forge(protocol, Conversation(protocol).request(), call_id="c1", arguments=non_object, result_id="c1")
        await _refused(env, protocol, forged, h.secret, 400, "must be a JSON object")
        # a result before its call
        body = Conversation(protocol).request()
        early = _forge(protocol, Conversation(protocol).request(), call_id="c1", arguments=ok, result_id="c1")
        key = "input" if protocol == "responses" else "messages"
        n = len(body[key])
        early[key][n], early[key][n + 1] = early[key][n + 1], early[key][n]
        await _refused(env, protocol, early, h.secret, 400, "unknown tool call id 'c1'")
        assert env.gw.stats("s").bad_requests == 3 and len(env.gw.tree("s")) == 0
        # the consistent version of the same history is served
        good = _forge(protocol, Conversation(protocol).request(), call_id="c1", arguments=ok, result_id="c1")
        env.script("s", "fine")
        got, text, _ = await env.post(protocol, good, h.secret)
        assert got == 200, text[:300]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_counts_and_nesting_are_capped(hf_tokenizer, protocol):
    async with gateway_env(hf_tokenizer, max_messages=50, max_content_blocks=100, max_json_depth=8) as env:
        h = env.gw.open_session("s")
        body = Conversation(protocol).request()
        key = "input" if protocol == "responses" else "messages"
        many = json.loads(json.dumps(body))
        many[key] = many[key] + [many[key][-1]] * 60
        await _refused(env, protocol, many, h.secret, 400, "> 50 (gateway.max_messages)")
        if protocol != "chat":
            blocks = json.loads(json.dumps(body))
            blocks[key][-1]["content"] = blocks[key][-1]["content"] * 150
            await _refused(env, protocol, blocks, h.secret, 400, "too many content blocks")
        deep: dict = {"type": "string"}
        for _ in range(12):
            deep = {"type": "object", "properties": {"p": deep}}
        nested = json.loads(json.dumps(body))
        _set_schema(protocol, nested, deep)
        await _refused(env, protocol, nested, h.secret, 400, "nested deeper than 8")
        args = {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": {"i": 1}}}}}}}}}
        forged = _forge(protocol, Conversation(protocol).request(), call_id="c1", arguments=args, result_id="c1")
        await _refused(env, protocol, forged, h.secret, 400, "nested deeper than 8")
        assert len(env.gw.tree("s")) == 0
        await _still_serves(env, protocol, h.secret, "s")


def _set_schema(protocol: str, body: dict, schema: dict) -> None:
    tool = body["tools"][0]
    if protocol == "anthropic":
        tool["input_schema"] = schema
    elif protocol == "responses":
        tool["parameters"] = schema
    else:
        tool["function"]["parameters"] = schema
