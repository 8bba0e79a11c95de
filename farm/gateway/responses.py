"""OpenAI Responses API (Codex; OpenCode's OpenAI provider) <-> canonical.

Request: ``instructions``; ``input`` as a string or items: ``message`` items (with or
without ``type``; roles ``developer`` / ``system`` -> system, ``user``, ``assistant``),
``function_call`` (+ ``namespace``), ``function_call_output``, ``custom_tool_call``
(Codex's freeform ``apply_patch``: canonical arguments ``{"input": <text>}``),
``custom_tool_call_output``, ``reasoning`` (-> reasoning of the next assistant
message). Item kinds the template cannot show (``web_search_call``, ``compaction``,
``item_reference``, ...) are skipped and counted in ``meta["skipped_items"]``.
Tools: ``function``; ``custom`` (one string argument ``input``, the grammar in the
description); ``namespace`` (each inner function becomes ``<namespace>__<name>``,
mapped back to ``name`` + ``namespace`` on the way out); hosted tools we cannot run
(``web_search``, ``tool_search``, ``file_search``, ...) are dropped and listed; any
other type is a 400.

Reply items: ``reasoning`` (``reasoning_text`` content), ``message`` (``output_text``),
``function_call`` / ``custom_tool_call``; streamed as ``response.created``,
``response.in_progress``, per item ``response.output_item.added`` -> deltas ->
``response.output_item.done``, then ``response.completed`` (or
``response.incomplete`` with ``max_output_tokens`` when cut by length) with usage.
"""

from __future__ import annotations

from typing import Any, Mapping

from farm.errors import GatewayRequestError
from farm.gateway.bodies import ResponsesBody, parse_body
from farm.gateway.canonical import (
    CUSTOM_INPUT,
    CanonicalRequest,
    Message,
    NativeTool,
    TranslationMemo,
    TurnOutput,
    custom_tool,
    function_tool,
    merge_consecutive,
    parse_arguments,
    translate_all,
)
from farm.modeltext.toolcalls import ToolCall
from farm.gateway.wire import ReplyContext, bad_request, new_id, sse, text_of

NS_SEP = "__"
DROPPED_TOOLS = frozenset({
    "web_search", "web_search_preview", "tool_search", "file_search", "code_interpreter", "image_generation",
    "computer_use_preview", "computer", "mcp", "local_shell",
})  # fmt: skip
SKIPPED_ITEMS = frozenset({
    "web_search_call", "tool_search_call", "tool_search_output", "compaction", "compaction_summary",
    "item_reference", "image_generation_call", "file_search_call", "code_interpreter_call",
    "local_shell_call", "local_shell_call_output", "mcp_call", "mcp_list_tools", "ghost_snapshot",
})  # fmt: skip
_RENDERED = frozenset({"message", "function_call", "custom_tool_call", "function_call_output",
                       "custom_tool_call_output", "reasoning"})
ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}
ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "unsupported_media": ("invalid_request_error", "unsupported_media_type"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "permission_denied"),
    "not_found": ("invalid_request_error", "not_found"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit": ("rate_limit_error", "rate_limit_exceeded"),
    "timeout": ("server_error", "timeout"),
    "overloaded": ("server_error", "server_is_overloaded"),
    "api_error": ("server_error", "server_error"),
}
OVERLOADED_STATUS = 503


def _tools(raw: Any) -> tuple[list[dict[str, Any]], dict[str, NativeTool], list[str]]:
    if raw is None:
        return [], {}, []
    if not isinstance(raw, list):
        raise bad_request("tools must be a list")
    tools: list[dict[str, Any]] = []
    tool_map: dict[str, NativeTool] = {}
    dropped: list[str] = []

    def add_function(spec: Any, namespace: str | None) -> None:
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
            raise bad_request("a function tool needs a name")
        name = spec["name"] if namespace is None else f"{namespace}{NS_SEP}{spec['name']}"
        tools.append(function_tool(name, spec.get("description"), spec.get("parameters")))
        tool_map[name] = NativeTool("function", spec["name"], namespace)

    for tool in raw:
        if not isinstance(tool, dict):
            raise bad_request("each tool must be an object")
        kind = tool.get("type")
        if kind == "function":
            add_function(tool, None)
        elif kind == "custom":
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise bad_request("a custom tool needs a name")
            tools.append(custom_tool(tool["name"], tool.get("description"), tool.get("format")))
            tool_map[tool["name"]] = NativeTool("custom", tool["name"])
        elif kind == "namespace":
            ns = tool.get("name")
            if not isinstance(ns, str) or not ns or not isinstance(tool.get("tools"), list):
                raise bad_request("a namespace tool needs a name and a list of tools")
            for inner in tool["tools"]:
                if isinstance(inner, dict) and inner.get("type", "function") != "function":
                    dropped.append(f"{kind}:{inner.get('type')}")
                    continue
                add_function(inner, ns)
        elif kind in DROPPED_TOOLS:
            dropped.append(kind)
        else:
            raise bad_request(f"unsupported tool type {kind!r}")
    return tools, tool_map, dropped


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, dict):  # {"content": ..., "success": ...} (older Codex)
        output = output.get("content", "")
    return text_of(output, what=where)


def _item(i: int, item: Any) -> list[Message]:
    """One input item -> canonical messages (context-free: reasoning becomes a reasoning-only
    assistant message that ``merge_consecutive`` joins with the reply it belongs to)."""
    where = f"input.{i}"
    if not isinstance(item, dict):
        raise bad_request(f"{where} must be an object")
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise bad_request(f"{where}: unknown role {item.get('role')!r}")
        return [{"role": role, "content": text_of(item.get("content"), what=where)}]
    if kind in ("function_call", "custom_tool_call"):
        name = item.get("name")
        if not isinstance(name, str) or not isinstance(item.get("call_id"), str):
            raise bad_request(f"{where}: {kind} needs name and call_id")
        ns = item.get("namespace")
        cname = f"{ns}{NS_SEP}{name}" if isinstance(ns, str) and ns else name
        args = ({CUSTOM_INPUT: str(item.get("input") or "")} if kind == "custom_tool_call"
                else parse_arguments(item.get("arguments")))  # fmt: skip
        return [{"role": "assistant", "content": "",
                 "tool_calls": [{"id": item["call_id"], "type": "function",
                                 "function": {"name": cname, "arguments": args}}]}]  # fmt: skip
    if kind in ("function_call_output", "custom_tool_call_output"):
        if not isinstance(item.get("call_id"), str):
            raise bad_request(f"{where}: {kind} needs call_id")
        return [{"role": "tool", "tool_call_id": item["call_id"], "content": _output_text(item.get("output"), where)}]
    if kind == "reasoning":
        text = text_of(item.get("content"), what=where) or text_of(item.get("summary"), what=where)
        return [{"role": "assistant", "content": "", "reasoning_content": text}] if text else []
    if isinstance(kind, str):  # SKIPPED_ITEMS and item kinds we do not know: nothing to render
        return []
    raise bad_request(f"{where}: item needs a type")


def _items(raw: str | list[Any], instructions: str | None, memo: TranslationMemo | None,
           ) -> tuple[list[Message], list[str]]:
    msgs: list[Message] = []
    if instructions:
        msgs.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        msgs.append({"role": "user", "content": raw})
        return msgs, []
    msgs.extend(translate_all(raw, _item, memo))
    skipped = [str(it["type"]) for it in raw if isinstance(it, dict) and it.get("type") not in _RENDERED
               and isinstance(it.get("type"), str)]  # fmt: skip
    return msgs, skipped


class ResponsesProtocol:
    name = "responses"
    call_id_prefix = "call_"

    def parse(self, body: Any, headers: Mapping[str, str], memo: TranslationMemo | None = None) -> CanonicalRequest:
        env = parse_body(ResponsesBody, body)
        msgs, skipped = _items(env.input, env.instructions, memo)
        if not msgs:
            raise bad_request("input has no messages")
        tools, tool_map, dropped = memo.value("tools", env.tools, _tools) if memo else _tools(env.tools)
        return CanonicalRequest(
            protocol=self.name,
            model=env.model or "",
            messages=merge_consecutive(msgs),
            tools=tools,
            tool_map=tool_map,
            stream=bool(env.stream),
            max_tokens=env.max_output_tokens,
            temperature=env.temperature,
            top_p=env.top_p,
            dropped_tools=dropped,
            meta={"skipped_items": skipped} if skipped else {},
        )

    def new_context(self, req: CanonicalRequest, prompt_tokens: int) -> ReplyContext:
        return ReplyContext(response_id=new_id("resp_"), model=req.model, prompt_tokens=prompt_tokens)

    # ---- output items ------------------------------------------------------------
    @staticmethod
    def _call_item(req: CanonicalRequest, call: ToolCall) -> dict[str, Any]:
        native = req.tool_map.get(call.name)
        if native is not None and native.kind == "custom":
            args = call.arguments
            raw = args.get(CUSTOM_INPUT) if isinstance(args.get(CUSTOM_INPUT), str) else None
            if raw is None:
                strings = [v for v in args.values() if isinstance(v, str)]
                raw = strings[0] if len(args) == 1 and strings else call.arguments_json()
            return {"type": "custom_tool_call", "id": new_id("ctc_"), "status": "completed",
                    "call_id": call.id, "name": native.name, "input": raw}  # fmt: skip
        item = {"type": "function_call", "id": new_id("fc_"), "status": "completed", "call_id": call.id,
                "name": native.name if native else call.name, "arguments": call.arguments_json()}  # fmt: skip
        if native is not None and native.namespace:
            item["namespace"] = native.namespace
        return item

    def _output(self, req: CanonicalRequest, out: TurnOutput) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if out.reasoning:
            items.append({"type": "reasoning", "id": new_id("rs_"), "summary": [],
                          "content": [{"type": "reasoning_text", "text": out.reasoning}]})  # fmt: skip
        if out.content:
            items.append({"type": "message", "id": new_id("msg_"), "status": "completed", "role": "assistant",
                          "content": [{"type": "output_text", "text": out.content, "annotations": []}]})  # fmt: skip
        items.extend(self._call_item(req, c) for c in out.tool_calls)
        return items

    @staticmethod
    def _response(ctx: ReplyContext, status: str, output: list[dict[str, Any]], out: TurnOutput | None) -> dict[str, Any]:
        resp: dict[str, Any] = {
            "id": ctx.response_id, "object": "response", "created_at": ctx.created, "status": status,
            "model": ctx.model, "output": output, "error": None, "incomplete_details": None,
            "parallel_tool_calls": True, "usage": None,
        }  # fmt: skip
        if out is not None:
            resp["usage"] = {
                "input_tokens": out.prompt_tokens,
                "input_tokens_details": {"cached_tokens": out.cached_tokens},
                "output_tokens": out.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": out.prompt_tokens + out.output_tokens,
            }
            if out.stop_kind == "length":
                resp["incomplete_details"] = {"reason": "max_output_tokens"}
        return resp

    def reply(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> dict[str, Any]:
        status = "incomplete" if out.stop_kind == "length" else "completed"
        return self._response(ctx, status, self._output(req, out), out)

    def stream_head(self, req: CanonicalRequest, ctx: ReplyContext) -> bytes:
        resp = self._response(ctx, "in_progress", [], None)
        return (sse({"type": "response.created", "sequence_number": 0, "response": resp}, "response.created")
                + sse({"type": "response.in_progress", "sequence_number": 1, "response": resp},
                      "response.in_progress"))  # fmt: skip

    def stream_rest(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> bytes:
        seq = 2
        parts: list[bytes] = []

        def emit(event: str, **fields: Any) -> None:
            nonlocal seq
            parts.append(sse({"type": event, "sequence_number": seq, **fields}, event))
            seq += 1

        output = self._output(req, out)
        for idx, item in enumerate(output):
            iid, kind = item["id"], item["type"]
            if kind == "reasoning":
                emit("response.output_item.added", output_index=idx, item={**item, "content": []})
                text = item["content"][0]["text"]
                emit("response.reasoning_text.delta", item_id=iid, output_index=idx, content_index=0, delta=text)
                emit("response.reasoning_text.done", item_id=iid, output_index=idx, content_index=0, text=text)
            elif kind == "message":
                text = item["content"][0]["text"]
                emit("response.output_item.added", output_index=idx,
                     item={**item, "status": "in_progress", "content": []})  # fmt: skip
                part = {"type": "output_text", "text": "", "annotations": []}
                emit("response.content_part.added", item_id=iid, output_index=idx, content_index=0, part=part)
                emit("response.output_text.delta", item_id=iid, output_index=idx, content_index=0, delta=text)
                emit("response.output_text.done", item_id=iid, output_index=idx, content_index=0, text=text)
                emit("response.content_part.done", item_id=iid, output_index=idx, content_index=0,
                     part={**part, "text": text})  # fmt: skip
            elif kind == "function_call":
                emit("response.output_item.added", output_index=idx,
                     item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
                emit("response.function_call_arguments.delta", item_id=iid, output_index=idx, delta=item["arguments"])
                emit("response.function_call_arguments.done", item_id=iid, output_index=idx,
                     arguments=item["arguments"])  # fmt: skip
            else:  # custom_tool_call
                emit("response.output_item.added", output_index=idx,
                     item={**item, "status": "in_progress", "input": ""})  # fmt: skip
                emit("response.custom_tool_call_input.delta", item_id=iid, output_index=idx, delta=item["input"])
                emit("response.custom_tool_call_input.done", item_id=iid, output_index=idx, input=item["input"])
            emit("response.output_item.done", output_index=idx, item=item)
        if out.stop_kind == "length":
            emit("response.incomplete", response=self._response(ctx, "incomplete", output, out))
        else:
            emit("response.completed", response=self._response(ctx, "completed", output, out))
        return b"".join(parts)

    def error_body(self, err: GatewayRequestError) -> tuple[int, dict[str, Any]]:
        etype, code = ERROR_TYPES.get(err.kind, ("server_error", None))
        status = OVERLOADED_STATUS if err.kind == "overloaded" else err.status
        return status, {"error": {"message": str(err), "type": etype, "param": None, "code": code}}

    def stream_error(self, ctx: ReplyContext, err: GatewayRequestError) -> bytes:
        _, body = self.error_body(err)
        resp = self._response(ctx, "failed", [], None)
        resp["error"] = {"code": body["error"]["code"] or "server_error", "message": str(err)}
        return sse({"type": "response.failed", "sequence_number": 2, "response": resp}, "response.failed")
