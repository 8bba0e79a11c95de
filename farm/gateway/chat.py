"""OpenAI Chat Completions (OpenCode's openai-compatible provider) <-> canonical.

Request: ``messages`` with roles ``system`` / ``developer`` (-> system), ``user``,
``assistant`` (``content``, ``tool_calls`` with JSON-string arguments,
``reasoning_content`` / ``reasoning``), ``tool`` (``tool_call_id``); content as a string
or parts (text; images/files -> placeholders). Tools: ``function`` only (another type
is a 400). ``n`` must be 1.

Reply: ``chat.completion`` / streamed ``chat.completion.chunk``: a role chunk, then
``reasoning_content``, ``content`` and ``tool_calls`` deltas (every parallel call with
its own ``index``), a final chunk with ``finish_reason`` (``stop`` / ``length`` /
``tool_calls``), a usage chunk when ``stream_options.include_usage``, then ``[DONE]``.
"""

from __future__ import annotations

from typing import Any, Mapping

from farm.errors import GatewayRequestError
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
from farm.gateway.bodies import ChatBody, parse_body
from farm.gateway.responses import ERROR_TYPES, OVERLOADED_STATUS
from farm.gateway.wire import (
    ReplyContext,
    bad_request,
    new_id,
    sse,
    stop_list,
    text_of,
)

FINISH = {"tool_calls": "tool_calls", "stop": "stop", "length": "length", "stop_sequence": "stop"}
DONE = b"data: [DONE]\n\n"


def _message(m: Any, where: str) -> Message:
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object")
    role = m.get("role")
    if role in ("system", "developer"):
        return {"role": "system", "content": text_of(m.get("content"), what=where)}
    if role == "user":
        return {"role": "user", "content": text_of(m.get("content"), what=where)}
    if role in ("tool", "function"):
        tid = m.get("tool_call_id") or m.get("name")
        if not isinstance(tid, str):
            raise bad_request(f"{where}: a tool message needs tool_call_id")
        return {"role": "tool", "tool_call_id": tid, "content": text_of(m.get("content"), what=where)}
    if role == "assistant":
        msg: Message = {"role": "assistant", "content": text_of(m.get("content"), what=where)}
        reasoning = m.get("reasoning_content") or m.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            msg["reasoning_content"] = reasoning
        calls = []
        for j, tc in enumerate(m.get("tool_calls") or ()):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise bad_request(f"{where}.tool_calls.{j}: needs function.name")
            calls.append({"id": str(tc.get("id") or ""), "type": "function",
                          "function": {"name": fn["name"], "arguments": parse_arguments(fn.get("arguments"))}})
        if calls:
            msg["tool_calls"] = calls
        return msg
    raise bad_request(f"{where}: unknown role {role!r}")


def _tools(raw: Any) -> tuple[list[dict[str, Any]], dict[str, NativeTool]]:
    if raw is None:
        return [], {}
    if not isinstance(raw, list):
        raise bad_request("tools must be a list")
    tools, tool_map = [], {}
    for tool in raw:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise bad_request(f"unsupported tool type {kind!r}")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise bad_request("a function tool needs function.name")
        tools.append(function_tool(fn["name"], fn.get("description"), fn.get("parameters")))
        tool_map[fn["name"]] = NativeTool("function", fn["name"])
    return tools, tool_map


class ChatProtocol:
    name = "chat"
    call_id_prefix = "call_"

    def parse(self, body: Any, headers: Mapping[str, str], memo: TranslationMemo | None = None) -> CanonicalRequest:
        env = parse_body(ChatBody, body)
        msgs = translate_all(env.messages, lambda i, m: [_message(m, f"messages.{i}")], memo)
        tools, tool_map = memo.value("tools", env.tools, _tools) if memo else _tools(env.tools)
        return CanonicalRequest(
            protocol=self.name,
            model=env.model or "",
            messages=merge_consecutive(msgs),
            tools=tools,
            tool_map=tool_map,
            stream=bool(env.stream),
            max_tokens=env.max_completion_tokens or env.max_tokens,
            temperature=env.temperature,
            top_p=env.top_p,
            stop=stop_list(env.stop),
            meta={"include_usage": bool(env.stream_options and env.stream_options.include_usage)},
        )

    def new_context(self, req: CanonicalRequest, prompt_tokens: int) -> ReplyContext:
        return ReplyContext(response_id=new_id("chatcmpl-"), model=req.model, prompt_tokens=prompt_tokens)

    @staticmethod
    def _usage(out: TurnOutput) -> dict[str, Any]:
        return {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.output_tokens,
                "total_tokens": out.prompt_tokens + out.output_tokens,
                "prompt_tokens_details": {"cached_tokens": out.cached_tokens}}  # fmt: skip

    @staticmethod
    def _calls(out: TurnOutput) -> list[dict[str, Any]]:
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
                for c in out.tool_calls]  # fmt: skip

    def reply(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": out.content or None}
        if out.reasoning:
            message["reasoning_content"] = out.reasoning
        if out.tool_calls:
            message["tool_calls"] = self._calls(out)
        return {
            "id": ctx.response_id, "object": "chat.completion", "created": ctx.created, "model": ctx.model,
            "choices": [{"index": 0, "message": message, "finish_reason": FINISH[out.stop_kind], "logprobs": None}],
            "usage": self._usage(out),
        }  # fmt: skip

    def _chunk(self, ctx: ReplyContext, delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({"id": ctx.response_id, "object": "chat.completion.chunk", "created": ctx.created,
                    "model": ctx.model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})  # fmt: skip

    def stream_head(self, req: CanonicalRequest, ctx: ReplyContext) -> bytes:
        return self._chunk(ctx, {"role": "assistant", "content": ""})

    def stream_rest(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> bytes:
        parts: list[bytes] = []
        if out.reasoning:
            parts.append(self._chunk(ctx, {"reasoning_content": out.reasoning}))
        if out.content:
            parts.append(self._chunk(ctx, {"content": out.content}))
        for index, call in enumerate(self._calls(out)):
            parts.append(self._chunk(ctx, {"tool_calls": [{"index": index, **call}]}))
        parts.append(self._chunk(ctx, {}, FINISH[out.stop_kind]))
        if req.meta.get("include_usage"):
            parts.append(sse({"id": ctx.response_id, "object": "chat.completion.chunk", "created": ctx.created,
                              "model": ctx.model, "choices": [], "usage": self._usage(out)}))  # fmt: skip
        parts.append(DONE)
        return b"".join(parts)

    def error_body(self, err: GatewayRequestError) -> tuple[int, dict[str, Any]]:
        etype, code = ERROR_TYPES.get(err.kind, ("server_error", None))
        status = OVERLOADED_STATUS if err.kind == "overloaded" else err.status
        return status, {"error": {"message": str(err), "type": etype, "param": None, "code": code}}

    def stream_error(self, ctx: ReplyContext, err: GatewayRequestError) -> bytes:
        return sse(self.error_body(err)[1]) + DONE
