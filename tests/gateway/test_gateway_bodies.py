"""The request bodies' pydantic models: every captured CLI body passes (its unknown fields
ignored), and a malformed body is a 400 that names the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.errors import GatewayRequestError
from farm.gateway.anthropic import AnthropicProtocol
from farm.gateway.bodies import AnthropicBody, ChatBody, ResponsesBody, parse_body
from farm.gateway.chat import ChatProtocol
from farm.gateway.responses import ResponsesProtocol

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
MODELS = {"/v1/messages": AnthropicBody, "/v1/responses": ResponsesBody, "/v1/chat/completions": ChatBody}
PROTOCOLS = {AnthropicBody: AnthropicProtocol(), ResponsesBody: ResponsesProtocol(), ChatBody: ChatProtocol()}


def _captured() -> list[tuple[str, type, dict]]:
    out = []
    for path in sorted(CAPTURES.glob("*/*.json")):
        cap = json.loads(path.read_text())
        model = MODELS.get(cap["path"].split("?")[0])
        if model is not None and isinstance(cap.get("body"), dict):
            out.append((f"{path.parent.name}/{path.name}", model, cap["body"]))
    return out


@pytest.mark.parametrize(("name", "model", "body"), _captured(), ids=[c[0] for c in _captured()])
def test_every_captured_body_passes(name, model, body):
    env = parse_body(model, body)
    assert env.model == body["model"] and env.stream == body.get("stream")
    req = PROTOCOLS[model].parse(body, {})
    assert req.messages and req.model == body["model"]


def test_the_three_kinds_are_all_captured():
    assert {m for _, m, _ in _captured()} == set(MODELS.values())


BAD = [
    (ChatBody, {"messages": []}, "messages: List should have at least 1 item"),
    (ChatBody, {"model": "m"}, "messages is required"),
    (ChatBody, {"messages": [{}], "n": 2}, "n: Input should be 1, got 2"),
    (ChatBody, {"messages": [{}], "temperature": "0.5"}, "temperature: Input should be a valid number, got '0.5'"),
    (ChatBody, {"messages": [{}], "max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1, got 0"),
    (ChatBody, {"messages": [{}], "max_completion_tokens": True}, "max_completion_tokens: Input should be a valid "
                                                                   "integer, got True"),  # fmt: skip
    (ChatBody, {"messages": [{}], "stop": 5}, "stop: must be a string or a list of strings, got 5"),
    (ChatBody, {"messages": [{}], "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage: Input should be a valid boolean, got 'yes'"),
    (ChatBody, {"messages": [{}], "tools": {"a": 1}}, "tools: Input should be a valid list"),
    (AnthropicBody, {"messages": "hi"}, "messages: Input should be a valid list, got 'hi'"),
    (AnthropicBody, {"messages": [{}], "system": 3}, "system: must be a string or a list, got 3"),
    (AnthropicBody, {"messages": [{}], "model": 7}, "model: Input should be a valid string, got 7"),
    (AnthropicBody, {"messages": [{}], "stop_sequences": ["a", 1]}, "stop_sequences"),
    (AnthropicBody, {"messages": [{}], "output_config": {"format": "json"}},
     "output_config.format: Input should be a valid dictionary, got 'json'"),
    (ResponsesBody, {"model": "m"}, "input is required"),
    (ResponsesBody, {"input": 5}, "input: must be a string or a list, got 5"),
    (ResponsesBody, {"input": "hi", "instructions": ["x"]}, "instructions: Input should be a valid string"),
    (ResponsesBody, {"input": "hi", "max_output_tokens": 1.5}, "max_output_tokens: Input should be a valid integer"),
    (ResponsesBody, ["input"], "request body must be a JSON object"),
]


@pytest.mark.parametrize(("model", "body", "says"), BAD)
def test_a_malformed_body_is_a_400_naming_the_field(model, body, says):
    with pytest.raises(GatewayRequestError) as err:
        PROTOCOLS[model].parse(body, {})
    assert err.value.status == 400 and says in str(err.value), str(err.value)


def test_unknown_fields_are_ignored_and_scalars_reach_the_request():
    body = {"messages": [{"role": "user", "content": "hi"}], "model": "m", "stream": True, "temperature": 1,
            "top_p": 0.5, "max_tokens": 9, "max_completion_tokens": 7, "stop": ["", "END"], "n": 1,
            "stream_options": {"include_usage": True, "extra": 1}, "parallel_tool_calls": False, "seed": 3}
    req = ChatProtocol().parse(body, {})
    assert (req.model, req.stream, req.temperature, req.top_p, req.max_tokens, req.stop, req.meta) == (
        "m", True, 1.0, 0.5, 7, ["END"], {"include_usage": True})
    req = AnthropicProtocol().parse({"messages": [{"role": "user", "content": "hi"}], "stop_sequences": "X",
                                     "output_config": {"format": {"type": "json_schema"}}, "thinking": {}}, {})
    assert (req.model, req.stop, req.side_hint, req.max_tokens) == ("", ["X"], True, None)
    req = ResponsesProtocol().parse({"input": "hi", "instructions": "be brief", "max_output_tokens": 5,
                                     "reasoning": {"effort": "low"}, "store": False}, {})
    assert [m["role"] for m in req.messages] == ["system", "user"] and req.max_tokens == 5
