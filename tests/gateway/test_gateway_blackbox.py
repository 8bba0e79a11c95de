"""Black-box mode over real HTTP: a CLI-shaped request -> farm's gateway -> a hosted
endpoint (testkit.hosted: the vendors' protocols, with injected failures) and
back; each turn recorded as canonical messages, failures classified."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from farm.gateway.config import GatewayConfig
from farm.gateway.endpoints import AnthropicEndpoint, OpenAIEndpoint
from farm.gateway.gateway import Gateway
from farm.gateway.hosted import Failure, classify, parse_retry_after, retry_delay
from farm.rollout.outcome import outcome_for_endpoint
from farm.status import RolloutStatus
from farm.tasks.model import GitSource, Task
from testkit.hosted import Fault, HostedFake
from farm.trajectory.records import FinishReason, TurnFlag
from farm.trajectory.transcript import request_messages

INSTRUCTION = "Fix greet() in hello.py: it must return 'Hello, <name>!' with an exclamation mark."
TASK = Task(id="hello-1", instruction=INSTRUCTION, workspace=GitSource(url="/nonexistent", base_commit="0" * 40),
            gold_patch="--- a/hello.py\n+++ b/hello.py\n@@ -1 +1 @@\n-x\n+y\n", test_command="true")
BASH = {"name": "Bash", "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                          "description": {"type": "string"}}, "required": ["command"]}}


def endpoint(kind: str, base: str, **kw: Any):
    kw = {"max_tokens": 4096, **kw}
    if kind == "anthropic":
        return AnthropicEndpoint(kind="anthropic", base_url=base + "/v1", model="claude-x", headers={"X-Team": "rl"},
                                 **kw)  # fmt: skip
    return OpenAIEndpoint(kind="openai", api=kind, base_url=base + "/v1", model="qwen-x", thinking=False,
                          headers={"X-Team": "rl"}, **kw)  # fmt: skip


async def claude_turn(http: aiohttp.ClientSession, gw: Gateway, secret: str, messages: list[dict[str, Any]],
                      *, stream: bool = False) -> tuple[int, Any]:
    body = {"model": "farm-policy", "max_tokens": 32000, "stream": stream, "tools": [BASH],
            "system": [{"type": "text", "text": "You are Claude Code."}], "messages": messages}
    async with http.post(gw.base_url + "/v1/messages?beta=true", json=body, headers={"x-api-key": secret}) as r:
        text = await r.text()
        return r.status, (text if stream else json.loads(text))


@pytest.mark.parametrize("kind", ["anthropic", "chat", "responses"])
async def test_claude_request_through_each_hosted_protocol(hf_tokenizer, kind):
    async with HostedFake([TASK], hf_tokenizer, api_key="sk-good") as fake, aiohttp.ClientSession() as http:
        async with Gateway.for_endpoint(GatewayConfig(), "ep", endpoint(kind, fake.base_url), "sk-good") as gw:
            secret = gw.open_session("r1").secret
            msgs = [{"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]}]
            status, reply = await claude_turn(http, gw, secret, msgs)
            assert status == 200, reply
            uses = [b for b in reply["content"] if b["type"] == "tool_use"]
            assert [u["name"] for u in uses] == ["Bash", "Bash"]  # the oracle's two parallel looks
            msgs += [{"role": "assistant", "content": reply["content"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "ok"}
                                                  for u in uses]}]  # fmt: skip
            status, text = await claude_turn(http, gw, secret, msgs, stream=True)
            assert status == 200 and "event: message_stop" in text and '"tool_use"' in text
            transcript = await gw.close_session("r1")
        path, body, headers = fake.requests[-1]
        assert path.endswith({"anthropic": "/messages", "chat": "/chat/completions", "responses": "/responses"}[kind])
        assert body["model"] in ("claude-x", "qwen-x") and headers["X-Team"] == "rl"
        assert body.get("max_tokens", body.get("max_output_tokens")) == 4096  # the endpoint's cap, not the CLI's
        if kind == "chat":
            assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert "sk-good" not in json.dumps(body) and secret not in json.dumps(body)
    assert len(transcript.turns) == 2 and transcript.failure is None
    second = transcript.turns[1]
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert second.response["tool_calls"] and second.finish_reason is FinishReason.STOP
    assert second.prompt_tokens > 0 and second.output_tokens > 0 and second.latency_ms > 0
    rows = transcript.rows(run_id="r", rollout_id="r1", task_id="hello-1")
    row = rows[1]  # stores only what the second request added to the first
    assert row["extends_turn"] == 0 and [m["role"] for m in json.loads(row["messages"])] == ["assistant", "tool", "tool"]
    assert request_messages(rows) == [t.messages for t in transcript.turns]
    assert row["endpoint"] == "ep" and json.loads(row["tools"]) == ["Bash"] and row["output_ids"] is None


@pytest.mark.parametrize("fault, status, failure, cli_status", [
    (Fault(status=401), "auth_error", True, 401),
    (Fault(status=403), "auth_error", True, 401),
    (Fault(status=500, times=3), "engine_error", True, 529),
    (Fault(hang_s=1.0, times=3), "engine_error", True, 504),
    (Fault(status=429, retry_after=0.2, times=2), None, False, 200),  # retried within the budget: succeeds
    (Fault(context_length=True), None, False, 200),  # the policy's own context overflow: the session ends there
])  # fmt: skip
async def test_endpoint_failures_map_to_statuses(hf_tokenizer, fault, status, failure, cli_status):
    async with HostedFake([TASK], hf_tokenizer, api_key="sk-good") as fake, aiohttp.ClientSession() as http:
        ep = endpoint("anthropic", fake.base_url, max_retries=2, backoff_s=0.05, timeout_s=0.4)
        async with Gateway.for_endpoint(GatewayConfig(), "ep", ep, "sk-good") as gw:
            secret = gw.open_session("r1").secret
            fake.inject(fault)
            code, reply = await claude_turn(http, gw, secret, [{"role": "user", "content": INSTRUCTION}])
            transcript = await gw.close_session("r1")
    assert code == cli_status, reply
    if failure:
        assert transcript.failure is not None and outcome_for_endpoint(*transcript.failure).status.value == status
        assert "hosted endpoint failed" in transcript.failure[1] and not transcript.turns
    else:
        assert transcript.failure is None and len(transcript.turns) == 1
    if fault.status == 429:
        assert len(fake.requests) == 3 and transcript.turns[0].attempts == 3 and reply["stop_reason"] == "tool_use"
    if fault.context_length:  # a normal end of turn with a short text (farm.gateway.budget), the stop remembered
        assert reply["stop_reason"] == "end_turn" and [b["type"] for b in reply["content"]] == ["text"]
        assert "context window" in reply["content"][0]["text"]
        assert transcript.turns[0].flags >= {TurnFlag.CONTEXT_LIMIT, TurnFlag.BUDGET_STOP}
        assert transcript.budget_stop is not None and transcript.budget_stop.budget.value == "context"


async def test_wrong_key_is_an_auth_failure(hf_tokenizer):
    async with HostedFake([TASK], hf_tokenizer, api_key="sk-good") as fake, aiohttp.ClientSession() as http:
        async with Gateway.for_endpoint(GatewayConfig(), "ep", endpoint("chat", fake.base_url), "sk-wrong") as gw:
            secret = gw.open_session("r1").secret
            code, _ = await claude_turn(http, gw, secret, [{"role": "user", "content": INSTRUCTION}])
            transcript = await gw.close_session("r1")
    assert code == 401 and transcript.failure[0] == "auth" and "sk-wrong" not in transcript.failure[1]
    assert outcome_for_endpoint(*transcript.failure).status is RolloutStatus.AUTH_ERROR


def test_retry_policy_is_pure():
    ep = endpoint("chat", "http://h", max_retries=3, retry_budget_s=10.0, backoff_s=1.0)
    assert retry_delay(Failure.RATE_LIMIT, 1, 2.5, 0.0, ep) == 2.5  # retry-after honoured
    assert retry_delay(Failure.RATE_LIMIT, 1, 30.0, 0.0, ep) is None  # past the budget: fail now, never sleep past it
    assert retry_delay(Failure.RATE_LIMIT, 1, 2.5, 0.0, ep, left_s=2.0) is None  # past the agent phase's end
    assert [retry_delay(Failure.SERVER, n, None, 0.0, ep) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, None]
    assert retry_delay(Failure.AUTH, 1, None, 0.0, ep) is None and retry_delay(Failure.CONTEXT_LENGTH, 1, 1, 0, ep) is None
    assert classify(400, "invalid_request_error: prompt is too long: 1 > 0") is Failure.CONTEXT_LENGTH
    assert classify(400, "bad tool schema") is Failure.REJECTED and classify(529, "") is Failure.SERVER
    assert parse_retry_after("3") == 3.0 and parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0


async def test_logprobs_recorded_retokenized_when_the_tokenizer_is_known(hf_tokenizer):
    async with HostedFake([TASK], hf_tokenizer, api_key="k") as fake, aiohttp.ClientSession() as http:
        ep = endpoint("chat", fake.base_url, top_logprobs=2)
        for tok in (hf_tokenizer, None):
            async with Gateway.for_endpoint(GatewayConfig(), "ep", ep, "k", tokenizer=tok) as gw:
                secret = gw.open_session("r1").secret
                code, reply = await claude_turn(http, gw, secret, [{"role": "user", "content": "Say hello."}])  # an unknown task: text
                transcript = await gw.close_session("r1")
            assert code == 200 and fake.requests[-1][1]["logprobs"] is True
            (turn,) = transcript.turns
            text = turn.response["content"]
            assert text and len(turn.output_logprobs) == len(hf_tokenizer.encode(text, add_special_tokens=False))
            if tok is None:  # logprobs kept, but no ids: nothing to re-tokenize with
                assert turn.output_ids is None and TurnFlag.RETOKENIZED not in turn.flags
            else:
                assert turn.output_ids == hf_tokenizer.encode(text, add_special_tokens=False)
                assert TurnFlag.RETOKENIZED in turn.flags
                row = transcript.rows(run_id="r", rollout_id="r1", task_id="x")[0]
                assert row["output_ids"] == turn.output_ids and "retokenized" in json.loads(row["flags"])


async def test_rate_limit_retries_stop_at_the_agent_phase_deadline(hf_tokenizer):
    import time

    async with HostedFake([TASK], hf_tokenizer, api_key="k") as fake, aiohttp.ClientSession() as http:
        async with Gateway.for_endpoint(GatewayConfig(), "ep", endpoint("anthropic", fake.base_url), "k") as gw:
            secret = gw.open_session("r1").secret
            gw.set_deadline("r1", time.monotonic() + 1.0)
            fake.inject(Fault(status=429, retry_after=5.0))  # within retry_budget_s, past the agent's end
            code, _ = await claude_turn(http, gw, secret, [{"role": "user", "content": INSTRUCTION}])
            transcript = await gw.close_session("r1")
    assert code == 429 and len(fake.requests) == 1
    assert transcript.failure[0] == "rate_limit" and "rate_limit" in transcript.failure[1]
    assert outcome_for_endpoint(*transcript.failure).status is RolloutStatus.ENGINE_ERROR


async def test_budgets_end_a_black_box_session_like_an_engine_one(hf_tokenizer):
    """The endpoint's max_tokens cut a turn (its length stop), then the turn budget: the CLI
    gets a normal end of turn each time, the transcript keeps what the endpoint said."""
    async with HostedFake([TASK], hf_tokenizer, api_key="sk-good") as fake, aiohttp.ClientSession() as http:
        async with Gateway.for_endpoint(GatewayConfig(), "ep", endpoint("chat", fake.base_url, max_tokens=8),
                                        "sk-good") as gw:  # fmt: skip
            secret = gw.open_session("cut").secret
            code, reply = await claude_turn(http, gw, secret, [{"role": "user", "content": INSTRUCTION}])
            assert code == 200 and reply["stop_reason"] == "end_turn"
            assert [b["type"] for b in reply["content"]][-1] == "text"  # (after the cut reply's thinking)
            assert not any(b["type"] == "tool_use" for b in reply["content"])
            code, again = await claude_turn(http, gw, secret, [{"role": "user", "content": INSTRUCTION}])
            assert code == 200 and again["stop_reason"] == "end_turn"  # the session is over: not sent on
            cut = await gw.close_session("cut")
            secret = gw.open_session("turns", max_turns=0).secret
            code, refused = await claude_turn(http, gw, secret, [{"role": "user", "content": INSTRUCTION}])
            turns = await gw.close_session("turns")
    assert len(fake.requests) == 1  # the endpoint saw the first request only
    (first,) = cut.turns
    assert first.finish_reason is FinishReason.LENGTH and first.output_tokens == 8  # as the endpoint answered
    assert TurnFlag.BUDGET_STOP in first.flags and (cut.budget_stop.budget.value, cut.budget_stop.limit) == ("output", 8)
    assert code == 200 and refused["stop_reason"] == "end_turn" and "turn budget" in refused["content"][0]["text"]
    assert turns.budget_stop.budget.value == "max_turns" and TurnFlag.TURN_LIMIT in turns.turns[0].flags
