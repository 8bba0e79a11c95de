"""Anthropic Messages API (Claude Code; OpenCode's Anthropic provider) <-> canonical.

Request: ``system`` (string or text blocks; Claude Code's per-request
``x-anthropic-billing-header`` block is dropped: it is metadata, and it would break
the append-only prefix), ``messages`` with ``user`` / ``assistant`` (and Claude Code's
``role: "system"`` mid-conversation messages), blocks ``text``, ``image`` /
``document`` (placeholders), ``thinking`` (-> reasoning; ``redacted_thinking``
dropped), ``tool_use``, ``tool_result`` (incl. ``is_error``). Tools: custom tools
(``name``, ``input_schema``); Anthropic server/client tool types (``web_search_*``,
``bash_*``, ...) are dropped and listed in the request's ``dropped_tools``; any other
type is a 400.

Reply: content blocks ``thinking`` (signature = an opaque farm marker), ``text``,
``tool_use``; streamed as ``message_start``, ``content_block_start`` /
``content_block_delta`` (``thinking_delta`` + ``signature_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop`` per block, ``message_delta``
(``stop_reason`` + usage) and ``message_stop``.
"""

from __future__ import annotations

from typing import Any, Mapping

import orjson

from farm.errors import GatewayRequestError
from farm.gateway.bodies import AnthropicBody, parse_body
from farm.gateway.canonical import (
    CanonicalRequest,
    Message,
    NativeTool,
    TranslationMemo,
    TurnOutput,
    function_tool,
    merge_consecutive,
    parse_arguments,
    translate_all,
)
from farm.gateway.wire import (
    ReplyContext,
    bad_request,
    new_id,
    sse,
    stop_list,
    text_of,
)

BILLING_PREFIX = "x-anthropic-billing-header:"
# Anthropic-defined tools we cannot execute or emulate: dropped, never a 400.
DROPPED_TOOL_PREFIXES = (
    "web_search_", "web_fetch_", "code_execution_", "bash_", "text_editor_", "computer_", "memory_",
    "tool_search_tool_", "mcp_toolset",
)  # fmt: skip
STOP_REASONS = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens", "stop_sequence": "stop_sequence"}
ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "unsupported_media": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "timeout": "timeout_error",
    "overloaded": "overloaded_error",
    "api_error": "api_error",
}
OVERLOADED_STATUS = 529


def _system_text(system: Any) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise bad_request("system must be a string or a list of text blocks")
    texts = []
    for block in system:
        if not isinstance(block, dict) or not isinstance(block.get("text"), str):
            raise bad_request("system blocks must be text blocks")
        if block["text"].startswith(BILLING_PREFIX):
            continue
        texts.append(block["text"])
    return "\n".join(texts)


def _user_messages(content: Any, where: str) -> list[Message]:
    """A user message -> canonical messages (tool results become ``tool`` messages, in order)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of blocks")
    out: list[Message] = []
    texts: list[Any] = []
    for block in content:
        if not isinstance(block, dict):
            raise bad_request(f"{where}: content blocks must be objects")
        if block.get("type") == "tool_result":
            if texts:
                out.append({"role": "user", "content": text_of(texts, what=where)})
                texts = []
            tid = block.get("tool_use_id")
            if not isinstance(tid, str):
                raise bad_request(f"{where}: tool_result needs tool_use_id")
            msg: Message = {"role": "tool", "tool_call_id": tid, "content": text_of(block.get("content"), what=where)}
            if block.get("is_error"):
                msg["is_error"] = True
            out.append(msg)
        else:
            texts.append(block)
    if texts or not out:
        out.append({"role": "user", "content": text_of(texts, what=where)})
    return out


def _assistant_message(content: Any, where: str) -> Message:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise bad_request(f"{where}: content must be a string or a list of blocks")
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, dict):
            raise bad_request(f"{where}: content blocks must be objects")
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str):
                raise bad_request(f"{where}: tool_use needs a name")
            calls.append({"id": str(block.get("id") or ""), "type": "function",
                          "function": {"name": block["name"], "arguments": parse_arguments(block.get("input"))}})
        # redacted_thinking, server_tool_use, *_tool_result: nothing the template can show
    msg: Message = {"role": "assistant", "content": "".join(texts)}
    if any(reasoning):
        msg["reasoning_content"] = "\n".join(r for r in reasoning if r)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _message(i: int, m: Any) -> list[Message]:
    if not isinstance(m, dict):
        raise bad_request(f"messages.{i} must be an object")
    role, where = m.get("role"), f"messages.{i}"
    if role == "user":
        return _user_messages(m.get("content"), where)
    if role == "assistant":
        return [_assistant_message(m.get("content"), where)]
    if role == "system":
        return [{"role": "system", "content": text_of(m.get("content"), what=where)}]
    raise bad_request(f"{where}: unknown role {role!r}")


def _tools(raw: Any) -> tuple[list[dict[str, Any]], dict[str, NativeTool], list[str]]:
    if raw is None:
        return [], {}, []
    if not isinstance(raw, list):
        raise bad_request("tools must be a list")
    tools, tool_map, dropped = [], {}, []
    for tool in raw:
        if not isinstance(tool, dict):
            raise bad_request("each tool must be an object")
        kind = tool.get("type")
        if kind in (None, "custom"):
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise bad_request("a tool needs a name")
            tools.append(function_tool(name, tool.get("description"), tool.get("input_schema")))
            tool_map[name] = NativeTool("function", name)
        elif isinstance(kind, str) and kind.startswith(DROPPED_TOOL_PREFIXES):
            dropped.append(kind)
        else:
            raise bad_request(f"unsupported tool type {kind!r}")
    return tools, tool_map, dropped


class AnthropicProtocol:
    name = "anthropic"
    call_id_prefix = "toolu_"

    def parse(self, body: Any, headers: Mapping[str, str], memo: TranslationMemo | None = None) -> CanonicalRequest:
        env = parse_body(AnthropicBody, body)
        msgs: list[Message] = []
        system = _system_text(env.system)
        if system:
            msgs.append({"role": "system", "content": system})
        msgs.extend(translate_all(env.messages, _message, memo))
        tools, tool_map, dropped = memo.value("tools", env.tools, _tools) if memo else _tools(env.tools)
        output_format = env.output_config.format if env.output_config else None
        return CanonicalRequest(
            protocol=self.name,
            model=env.model or "",
            messages=merge_consecutive(msgs),
            tools=tools,
            tool_map=tool_map,
            stream=bool(env.stream),
            max_tokens=env.max_tokens,
            temperature=env.temperature,
            top_p=env.top_p,
            stop=stop_list(env.stop_sequences),
            side_hint=not tools and output_format is not None and output_format.get("type") == "json_schema",
            dropped_tools=dropped,
        )

    def new_context(self, req: CanonicalRequest, prompt_tokens: int) -> ReplyContext:
        return ReplyContext(response_id=new_id("msg_"), model=req.model, prompt_tokens=prompt_tokens)

    @staticmethod
    def _blocks(ctx: ReplyContext, out: TurnOutput) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if out.reasoning:
            blocks.append({"type": "thinking", "thinking": out.reasoning, "signature": _signature(ctx)})
        if out.content:
            blocks.append({"type": "text", "text": out.content})
        for call in out.tool_calls:
            blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
        return blocks

    @staticmethod
    def _usage(out: TurnOutput) -> dict[str, int]:
        return {"input_tokens": out.prompt_tokens, "output_tokens": out.output_tokens,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": out.cached_tokens}  # fmt: skip

    def reply(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> dict[str, Any]:
        return {
            "id": ctx.response_id, "type": "message", "role": "assistant", "model": ctx.model,
            "content": self._blocks(ctx, out), "stop_reason": STOP_REASONS[out.stop_kind],
            "stop_sequence": out.matched_stop, "usage": self._usage(out),
        }  # fmt: skip

    def stream_head(self, req: CanonicalRequest, ctx: ReplyContext) -> bytes:
        message = {
            "id": ctx.response_id, "type": "message", "role": "assistant", "model": ctx.model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": ctx.prompt_tokens, "output_tokens": 1,
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }  # fmt: skip
        return sse({"type": "message_start", "message": message}, "message_start") + sse({"type": "ping"}, "ping")

    def stream_rest(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> bytes:
        parts: list[bytes] = []
        for index, block in enumerate(self._blocks(ctx, out)):
            kind = block["type"]
            if kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                deltas = [{"type": "thinking_delta", "thinking": block["thinking"]},
                          {"type": "signature_delta", "signature": block["signature"]}]  # fmt: skip
            elif kind == "text":
                start = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": block["text"]}]
            else:
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                deltas = [{"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}]
            parts.append(sse({"type": "content_block_start", "index": index, "content_block": start},
                             "content_block_start"))  # fmt: skip
            for delta in deltas:
                parts.append(sse({"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"))
            parts.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        parts.append(sse({
            "type": "message_delta",
            "delta": {"stop_reason": STOP_REASONS[out.stop_kind], "stop_sequence": out.matched_stop},
            "usage": self._usage(out),
        }, "message_delta"))  # fmt: skip
        parts.append(sse({"type": "message_stop"}, "message_stop"))
        return b"".join(parts)

    def error_body(self, err: GatewayRequestError) -> tuple[int, dict[str, Any]]:
        status = OVERLOADED_STATUS if err.kind == "overloaded" else err.status
        return status, {"type": "error", "error": {"type": ERROR_TYPES.get(err.kind, "api_error"), "message": str(err)}}

    def stream_error(self, ctx: ReplyContext, err: GatewayRequestError) -> bytes:
        return sse(self.error_body(err)[1], "error")


def _signature(ctx: ReplyContext) -> str:
    return "farm:" + ctx.response_id
