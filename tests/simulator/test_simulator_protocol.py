"""The scripted worker speaks SGLang's native /generate protocol (in-process, real sockets)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from farm.engine.config import FaultConfig, LatencyConfig
from farm.simulator import PolicyReply, ScriptedPolicy
from testkit.waits import async_wait_until

REPLY = "Let me check the file first. Then I will fix the bug."


def prompt_ids(tok, text: str = "Fix the bug please.") -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False)


async def generate(http, url, body, headers=None):
    async with http.post(url + "/generate", json=body, headers=headers or {}) as r:
        return r.status, await r.json()


async def stream(http, url, body):
    """SSE events as parsed JSON (``"[DONE]"`` kept as a string)."""
    async with http.post(url + "/generate", json={**body, "stream": True}) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events[:3]
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


async def test_non_stream_reply_shape_and_eos(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy([REPLY]))
    ids = prompt_ids(hf_tokenizer)
    status, out = await generate(http, url, {"input_ids": ids, "return_logprob": True, "rid": "r-1"})
    assert status == 200
    eos = hf_tokenizer.eos_token_id
    assert out["output_ids"][-1] == eos  # the matched EOS stays in output_ids
    assert out["output_ids"][:-1] == hf_tokenizer.encode(REPLY, add_special_tokens=False)
    assert out["text"] == REPLY  # skip_special_tokens (default) + stop trim
    meta = out["meta_info"]
    assert meta["id"] == "r-1"
    assert meta["finish_reason"] == {"type": "stop", "matched": eos}
    assert meta["prompt_tokens"] == len(ids)
    assert meta["completion_tokens"] == len(out["output_ids"])
    assert meta["weight_version"] == "default"
    assert isinstance(meta["cached_tokens"], int) and meta["e2e_latency"] >= 0
    lps = meta["output_token_logprobs"]
    assert len(lps) == len(out["output_ids"])
    assert [t[1] for t in lps] == out["output_ids"]
    assert all(isinstance(t[0], float) and t[0] < 0 and t[2] is None for t in lps)
    assert meta["input_token_logprobs"] == [[None, ids[-1], None]]


async def test_no_stop_trim_keeps_eos_text(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy([REPLY, REPLY]))
    ids = prompt_ids(hf_tokenizer)
    sp = {"skip_special_tokens": False, "no_stop_trim": True, "spaces_between_special_tokens": False}
    _, kept = await generate(http, url, {"input_ids": ids, "sampling_params": sp})
    assert kept["text"] == REPLY + "<|im_end|>"
    _, trimmed = await generate(http, url, {"input_ids": ids, "sampling_params": {"skip_special_tokens": False}})
    assert trimmed["text"] == REPLY
    assert kept["output_ids"] == trimmed["output_ids"]


async def test_logprobs_deterministic_per_seed(make_worker, http, hf_tokenizer):
    _, url0 = await make_worker(ScriptedPolicy(default=REPLY), seed=0)
    _, url1 = await make_worker(ScriptedPolicy(default=REPLY), seed=1)
    body = {"input_ids": prompt_ids(hf_tokenizer), "return_logprob": True}
    a = (await generate(http, url0, body))[1]["meta_info"]["output_token_logprobs"]
    b = (await generate(http, url0, body))[1]["meta_info"]["output_token_logprobs"]
    c = (await generate(http, url1, body))[1]["meta_info"]["output_token_logprobs"]
    assert a == b
    assert [t[0] for t in a] != [t[0] for t in c]


async def test_max_new_tokens_and_ignore_eos(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy(default=REPLY))
    ids = prompt_ids(hf_tokenizer)
    _, out = await generate(http, url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 5}})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert len(out["output_ids"]) == 5
    _, out = await generate(http, url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}})
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 40}
    assert len(out["output_ids"]) == 40 and hf_tokenizer.eos_token_id in out["output_ids"]
    # A model that never emits EOS runs into max_new_tokens.
    _, url2 = await make_worker(ScriptedPolicy([PolicyReply(text="and so on", eos=False)]))
    _, out = await generate(http, url2, {"input_ids": ids, "sampling_params": {"max_new_tokens": 30}})
    assert out["meta_info"]["finish_reason"]["type"] == "length" and len(out["output_ids"]) == 30


async def test_stop_strings_and_stop_token_ids(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy(default=REPLY))
    ids = prompt_ids(hf_tokenizer)
    _, out = await generate(http, url, {"input_ids": ids, "sampling_params": {"stop": ["Then"]}})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "Then"}
    assert out["text"] == "Let me check the file first. "
    assert "Then" in hf_tokenizer.decode(out["output_ids"])  # ids keep the tokens that made the stop string
    _, kept = await generate(http, url, {"input_ids": ids, "sampling_params": {"stop": "Then", "no_stop_trim": True}})
    assert kept["text"].startswith("Let me check the file first. Then")
    reply_ids = hf_tokenizer.encode(REPLY, add_special_tokens=False)
    stop_id = reply_ids[3]
    _, out = await generate(http, url, {"input_ids": ids, "sampling_params": {"stop_token_ids": [stop_id]}})
    assert out["output_ids"] == reply_ids[:4]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}


async def test_stream_chunks_are_cumulative_then_done(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy(default=REPLY))
    body = {"input_ids": prompt_ids(hf_tokenizer), "return_logprob": True}
    events = await stream(http, url, body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == len(chunks[-1]["output_ids"])  # stream_interval 1: one chunk per token
    for prev, nxt in zip(chunks, chunks[1:]):
        assert nxt["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
        assert nxt["text"].startswith(prev["text"])
        assert prev["meta_info"]["finish_reason"] is None
    _, whole = await generate(http, url, body)
    last = chunks[-1]
    assert last["output_ids"] == whole["output_ids"] and last["text"] == whole["text"]
    assert last["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert len(last["meta_info"]["output_token_logprobs"]) == len(last["output_ids"])
    # stream_interval groups tokens per chunk
    events = await stream(http, url, {**body, "sampling_params": {"stream_interval": 4}})
    assert len(events) - 1 == -(-len(whole["output_ids"]) // 4)


async def test_text_input_and_request_errors(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy(default=REPLY), context_length=64)
    status, out = await generate(http, url, {"text": "hello", "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and out["meta_info"]["prompt_tokens"] == len(hf_tokenizer.encode("hello"))
    bad = [
        {"sampling_params": {}},  # neither text nor input_ids
        {"text": "a", "input_ids": [1]},
        {"input_ids": [1, 2], "sampling_params": {"no_such_param": 1}},
        {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}},
        {"input_ids": list(range(5, 80))},  # longer than the context
    ]
    for body in bad:
        status, out = await generate(http, url, body)
        assert status == 400, body
        assert out["object"] == "error" and out["code"] == 400 and out["message"]
    async with http.post(url + "/generate", data=b"{not json", headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400


async def test_abort_request_finishes_with_abort(make_worker, http, hf_tokenizer):
    worker, url = await make_worker(ScriptedPolicy(default=REPLY * 20), latency=LatencyConfig(tokens_per_s=200))
    ids = prompt_ids(hf_tokenizer)
    task = asyncio.create_task(generate(http, url, {"input_ids": ids, "rid": "long-1"}))
    await async_wait_until(lambda: "long-1" in worker.inflight, timeout_s=10, what="the request in flight")
    await asyncio.sleep(0.1)  # some tokens generated before the abort
    async with http.post(url + "/abort_request", json={"rid": "long-1"}) as r:
        assert r.status == 200
    status, out = await asyncio.wait_for(task, 10)
    assert status == 200
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    full = len(hf_tokenizer.encode(REPLY * 20, add_special_tokens=False)) + 1
    assert 0 < len(out["output_ids"]) < full
    # Streaming: the last chunk carries the abort, then [DONE].
    body = {"input_ids": ids, "rid": "long-2", "stream": True}
    async with http.post(url + "/generate", json=body) as r:
        first = await r.content.readline()
        assert first.startswith(b"data: ")
        await http.post(url + "/abort_request", json={"rid": "long-2"})
        rest = (await r.read()).decode()
    events = [e.strip()[6:] for e in rest.split("\n\n") if e.strip().startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "abort"


async def test_client_disconnect_aborts_server_side(make_worker, hf_tokenizer):
    worker, url = await make_worker(ScriptedPolicy(default=REPLY * 20), latency=LatencyConfig(tokens_per_s=100))
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/generate", json={"input_ids": prompt_ids(hf_tokenizer), "stream": True}) as r:
            await r.content.readline()
    await async_wait_until(lambda: not worker.inflight, timeout_s=10, what="the disconnected request dropped")
    assert worker.stats.disconnected == 1


async def test_info_routes_cache_and_weight_update(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy(default=REPLY), model_name="pol", tokenizer_path="/tok")
    for path in ("/health", "/health_generate"):
        async with http.get(url + path) as r:
            assert r.status == 200
    for path in ("/model_info", "/get_model_info"):
        async with http.get(url + path) as r:
            info = await r.json()
            assert info["is_generation"] is True and info["tokenizer_path"] == "/tok"
    for path in ("/server_info", "/get_server_info"):
        async with http.get(url + path) as r:
            info = await r.json()
            assert info["served_model_name"] == "pol" and info["version"]
    async with http.get(url + "/v1/models") as r:
        assert (await r.json())["data"][0]["id"] == "pol"
    ids = prompt_ids(hf_tokenizer)
    _, first = await generate(http, url, {"input_ids": ids}, {"X-SMG-Routing-Key": "s1"})
    _, again = await generate(http, url, {"input_ids": ids + first["output_ids"] + ids[:3]}, {"X-SMG-Routing-Key": "s1"})
    assert again["meta_info"]["cached_tokens"] == len(ids) + len(first["output_ids"])
    async with http.post(url + "/flush_cache") as r:
        assert r.status == 200
    _, cold = await generate(http, url, {"input_ids": ids}, {"X-SMG-Routing-Key": "s1"})
    assert cold["meta_info"]["cached_tokens"] == 0
    async with http.post(url + "/update_weights_from_disk", json={"model_path": "/ckpt/step-7", "weight_version": "7"}) as r:
        body = await r.json()
        assert r.status == 200 and body["success"] is True
    _, out = await generate(http, url, {"input_ids": ids})
    assert out["meta_info"]["weight_version"] == "7"
    async with http.get(url + "/model_info") as r:
        assert (await r.json())["model_path"] == "/ckpt/step-7"
    async with http.post(url + "/update_weights_from_disk", json={}) as r:
        assert r.status == 400 and (await r.json())["success"] is False
    async with http.get(url + "/farm/stats") as r:
        stats = await r.json()
    assert stats["by_routing_key"] == {"s1": 3} and stats["requests"] == 4


async def test_injected_faults(make_worker, http, hf_tokenizer):
    ids = prompt_ids(hf_tokenizer)
    _, url = await make_worker(ScriptedPolicy(default=REPLY), faults=FaultConfig(error_rate=1.0))
    status, out = await generate(http, url, {"input_ids": ids})
    assert status == 500 and out["code"] == 500
    _, url = await make_worker(ScriptedPolicy(default=REPLY), faults=FaultConfig(drop_rate=1.0))
    for body in ({"input_ids": ids}, {"input_ids": ids, "stream": True}):
        with pytest.raises(aiohttp.ClientPayloadError):
            async with http.post(url + "/generate", json=body) as r:
                assert r.status == 200  # headers went out, then the connection was cut
                await r.read()
    worker, url = await make_worker(ScriptedPolicy(default=REPLY), faults=FaultConfig(hang_rate=1.0, hang_s=30))
    task = asyncio.create_task(generate(http, url, {"input_ids": ids, "rid": "hung"}))
    await async_wait_until(lambda: "hung" in worker.inflight, what="the request reached the worker")
    assert not task.done()
    await http.post(url + "/abort_request", json={"rid": "hung"})
    status, out = await asyncio.wait_for(task, 5)
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and out["output_ids"] == []
    assert worker.stats.faults["hang"] == 1


async def test_scripted_policy_over_http(make_worker, http, hf_tokenizer):
    policy = ScriptedPolicy()
    _, url = await make_worker(policy)
    async with http.post(url + "/farm/script", json={"replies": ["for s1"], "routing_key": "s1"}) as r:
        assert r.status == 200
    async with http.post(url + "/farm/script", json={"replies": ["shared", {"output_ids": [5, 6, 7], "eos": False}]}) as r:
        assert (await r.json())["pending"] == 3
    ids = prompt_ids(hf_tokenizer)
    _, a = await generate(http, url, {"input_ids": ids}, {"X-SMG-Routing-Key": "s2"})
    _, b = await generate(http, url, {"input_ids": ids}, {"X-SMG-Routing-Key": "s1"})
    _, c = await generate(http, url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 3}})
    _, d = await generate(http, url, {"input_ids": ids})
    assert (a["text"], b["text"], c["output_ids"], d["text"]) == ("shared", "for s1", [5, 6, 7], "OK.")
    assert [r.routing_key for r in policy.requests] == ["s2", "s1", None, None]
