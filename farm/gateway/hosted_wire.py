"""Canonical request -> a hosted endpoint's request, and its reply -> a ``HostedReply``.

The black-box gateway (:mod:`farm.gateway.blackbox`) parses the CLI's request with the
CLI's own protocol module into canonical messages, then writes it here in the
**endpoint's** protocol (OpenAI chat, OpenAI responses, Anthropic messages), so any
CLI works with any hosted endpoint; the reply comes back through the CLI's protocol
module as usual. Upstream calls are non-streamed (the CLI still gets its stream from
the gateway). Lossy on purpose, and said here: reasoning of earlier assistant turns is
not replayed (hosted APIs either ignore it or demand their own signatures), images
and documents are the canonical placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from farm.gateway.canonical import CanonicalRequest, Message, parse_arguments
from farm.gateway.endpoints import AnthropicEndpoint, HostedEndpoint, OpenAIEndpoint
from farm.modeltext.toolcalls import ToolCall
from farm.trajectory.records import FinishReason


@dataclass(frozen=True, slots=True)
class HostedReply:
    """One endpoint reply, protocol-neutral."""

    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish: FinishReason
    model: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    logprobs: list[tuple[str, float]] | None = field(default=None)  # (token text, logprob) per output token


def output_cap(req: CanonicalRequest, ep: HostedEndpoint) -> int | None:
    caps = [v for v in (req.max_tokens, ep.max_tokens) if v]
    return min(caps) if caps else None


def _json_args(args: Any) -> str:
    return args if isinstance(args, str) else orjson.dumps(args).decode()


def _calls_of(msg: Message) -> list[tuple[str, str, Any]]:
    out = []
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function", tc)
        out.append((tc.get("id") or "", fn.get("name") or "", fn.get("arguments")))
    return out


def _tool_call(call_id: str, name: str, raw: Any) -> ToolCall:
    args = parse_arguments(raw)
    return ToolCall(id=call_id, name=name, arguments=args if isinstance(args, dict) else {"input": args})


# ---- OpenAI chat ------------------------------------------------------------------
def chat_request(req: CanonicalRequest, ep: OpenAIEndpoint) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for m in req.messages:
        role = m["role"]
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.get("content") or None}
            calls = _calls_of(m)
            if calls:
                msg["tool_calls"] = [{"id": cid, "type": "function", "function": {"name": n, "arguments": _json_args(a)}}
                                     for cid, n, a in calls]  # fmt: skip
            messages.append(msg)
        elif role == "tool":
            messages.append({"role": "tool", "tool_call_id": m.get("tool_call_id", ""), "content": m.get("content", "")})
        else:
            messages.append({"role": role, "content": m.get("content", "")})
    body: dict[str, Any] = {"model": ep.model, "messages": messages, "stream": False}
    if req.tools:
        body["tools"] = req.tools
    cap = output_cap(req, ep)
    if cap:
        body["max_tokens"] = cap
    if req.stop:
        body["stop"] = req.stop
    for key in ("temperature", "top_p"):
        if getattr(req, key) is not None:
            body[key] = getattr(req, key)
    if ep.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": ep.thinking}
    if ep.top_logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = ep.top_logprobs
    return body


def chat_reply(body: dict[str, Any]) -> HostedReply:
    choice = (body.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    calls = tuple(_tool_call(tc.get("id") or "", (tc.get("function") or {}).get("name") or "",
                             (tc.get("function") or {}).get("arguments"))
                  for tc in msg.get("tool_calls") or ())  # fmt: skip
    usage = body.get("usage") or {}
    lp = (choice.get("logprobs") or {}).get("content")
    return HostedReply(
        content=msg.get("content") or "", reasoning=msg.get("reasoning_content") or msg.get("reasoning") or None,
        tool_calls=calls, finish=FinishReason.LENGTH if choice.get("finish_reason") == "length" else FinishReason.STOP,
        model=body.get("model") or "", prompt_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        logprobs=[(t.get("token", ""), float(t.get("logprob", 0.0))) for t in lp] if lp else None,
    )  # fmt: skip


# ---- OpenAI responses ---------------------------------------------------------------
def responses_request(req: CanonicalRequest, ep: OpenAIEndpoint) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for m in req.messages:
        role = m["role"]
        if role == "assistant":
            if m.get("content"):
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": m["content"]}]})  # fmt: skip
            for cid, name, args in _calls_of(m):
                items.append({"type": "function_call", "call_id": cid, "name": name, "arguments": _json_args(args)})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", ""),
                          "output": m.get("content", "")})  # fmt: skip
        else:
            items.append({"type": "message", "role": "developer" if role == "system" else role,
                          "content": [{"type": "input_text", "text": m.get("content", "")}]})  # fmt: skip
    body: dict[str, Any] = {"model": ep.model, "input": items, "stream": False, "store": False}
    if req.tools:
        body["tools"] = [{"type": "function", "name": t["function"]["name"],
                          "description": t["function"].get("description", ""),
                          "parameters": t["function"].get("parameters", {})} for t in req.tools]  # fmt: skip
    cap = output_cap(req, ep)
    if cap:
        body["max_output_tokens"] = cap
    return body


def responses_reply(body: dict[str, Any]) -> HostedReply:
    content, reasoning, calls = [], [], []
    for item in body.get("output") or ():
        kind = item.get("type")
        if kind == "message":
            content += [c.get("text", "") for c in item.get("content") or () if c.get("type") == "output_text"]
        elif kind == "reasoning":
            reasoning += [c.get("text", "") for c in (item.get("content") or item.get("summary") or ())]
        elif kind == "function_call":
            calls.append(_tool_call(item.get("call_id") or "", item.get("name") or "", item.get("arguments")))
        elif kind == "custom_tool_call":
            calls.append(ToolCall(id=item.get("call_id") or "", name=item.get("name") or "",
                                  arguments={"input": item.get("input", "")}))  # fmt: skip
    usage = body.get("usage") or {}
    return HostedReply(
        content="".join(content), reasoning="".join(reasoning) or None, tool_calls=tuple(calls),
        finish=FinishReason.LENGTH if body.get("status") == "incomplete" else FinishReason.STOP,
        model=body.get("model") or "", prompt_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cached_tokens=int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0),
    )  # fmt: skip


# ---- Anthropic messages -----------------------------------------------------------------
def anthropic_request(req: CanonicalRequest, ep: AnthropicEndpoint) -> dict[str, Any]:
    system = "\n\n".join(m.get("content", "") for m in req.messages if m["role"] == "system")
    messages: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:  # the API wants strictly alternating roles
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})

    for m in req.messages:
        role = m["role"]
        if role == "assistant":
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for cid, name, args in _calls_of(m):
                parsed = parse_arguments(args)
                blocks.append({"type": "tool_use", "id": cid, "name": name,
                               "input": parsed if isinstance(parsed, dict) else {"input": parsed}})  # fmt: skip
            add("assistant", blocks or [{"type": "text", "text": "(no output)"}])
        elif role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""), "content": m.get("content", "")}
            if m.get("is_error"):
                block["is_error"] = True
            add("user", [block])
        elif role == "user":
            add("user", [{"type": "text", "text": m.get("content") or "(empty)"}])
    body: dict[str, Any] = {"model": ep.model, "messages": messages, "stream": False,
                            "max_tokens": output_cap(req, ep) or ep.max_tokens or 8192}  # fmt: skip
    if system:
        body["system"] = system
    if req.tools:
        body["tools"] = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                          "input_schema": t["function"].get("parameters", {})} for t in req.tools]  # fmt: skip
    if req.stop:
        body["stop_sequences"] = req.stop
    if ep.thinking_budget:
        body["thinking"] = {"type": "enabled", "budget_tokens": ep.thinking_budget}
        body["max_tokens"] = max(body["max_tokens"], ep.thinking_budget + 1024)
    return body


def anthropic_reply(body: dict[str, Any]) -> HostedReply:
    content, reasoning, calls = [], [], []
    for block in body.get("content") or ():
        kind = block.get("type")
        if kind == "text":
            content.append(block.get("text", ""))
        elif kind == "thinking":
            reasoning.append(block.get("thinking", ""))
        elif kind == "tool_use":
            calls.append(_tool_call(block.get("id") or "", block.get("name") or "", block.get("input")))
    usage = body.get("usage") or {}
    return HostedReply(
        content="".join(content), reasoning="".join(reasoning) or None, tool_calls=tuple(calls),
        finish=FinishReason.LENGTH if body.get("stop_reason") == "max_tokens" else FinishReason.STOP,
        model=body.get("model") or "", prompt_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0), cached_tokens=int(usage.get("cache_read_input_tokens") or 0),
    )  # fmt: skip


def build(req: CanonicalRequest, ep: HostedEndpoint) -> tuple[str, dict[str, Any]]:
    """(route under base_url, JSON body) of ``req`` in the endpoint's protocol."""
    if isinstance(ep, AnthropicEndpoint):
        return "/messages", anthropic_request(req, ep)
    if ep.api == "responses":
        return "/responses", responses_request(req, ep)
    return "/chat/completions", chat_request(req, ep)


def parse(body: Any, ep: HostedEndpoint) -> HostedReply:
    if not isinstance(body, dict):
        raise ValueError(f"the endpoint replied with a JSON {type(body).__name__}, not an object")
    if isinstance(ep, AnthropicEndpoint):
        return anthropic_reply(body)
    return responses_reply(body) if ep.api == "responses" else chat_reply(body)
