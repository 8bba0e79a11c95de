"""Bounds on what a request may cost, and on what its tool history may claim, checked
before the gateway does any work for it.

Every check answers 400 in the request's own protocol shape (``GatewayRequestError``):

- **Size.** A body over ``GatewayConfig.body_limit`` bytes is refused (413) before it
  is read: by default 32 bytes per token of ``max_context_tokens`` (4 MiB at 131,072),
  never under 1 MiB. More than ``max_messages`` messages (or Responses input items),
  or more than ``max_content_blocks`` content blocks, are refused on the raw body,
  before translation (:func:`check_body`).
- **Nesting.** Tool schemas and tool-call inputs (the only free-form JSON a request
  carries) nested deeper than ``max_json_depth`` are refused.
- **Length.** A request whose text is longer than any prompt at the session's context
  limit could be (over 4 characters per token) and cannot fit is refused without
  tokenizing it all: first from the text it certainly renders (system, user and
  tool-result contents) with a floor from the tokenizer's longest token
  (``PromptRenderer.token_floor``), then while tokenizing, counting chunk by chunk
  (``PromptRenderer.check_length``). Answer: "prompt is too long" (``PromptTooLong``).
  A prompt over the limit that costs no more than one at the limit is tokenized and
  answered as before: the protocol's length stop, recorded with ``CONTEXT_LIMIT``.
- **Contradictions.** A tool result naming a call id that no earlier assistant message
  of the same request made, or a tool call whose input is not a JSON object, is
  refused: the Anthropic and OpenAI APIs refuse both, the CLIs never send them, and
  recording one would put into the turn tree a tool exchange no model output produced.
"""

from __future__ import annotations

from typing import Any

from farm.errors import GatewayRequestError
from farm.gateway.canonical import CanonicalRequest
from farm.gateway.config import GatewayConfig
from farm.gateway.render import PromptRenderer, PromptTooLong, bounded_chars

_CERTAIN_ROLES = ("system", "user", "tool")  # rendered by every template (assistant reasoning may be dropped)


def check_body(body: Any, config: GatewayConfig) -> None:
    """Message and content-block counts of a raw body (before it is translated)."""
    if not isinstance(body, dict):
        return  # the protocol parser answers with its own message
    items = body.get("messages", body.get("input"))
    if not isinstance(items, list):
        return
    if len(items) > config.max_messages:
        raise GatewayRequestError(f"too many messages: {len(items)} > {config.max_messages} (gateway.max_messages)")
    blocks = sum(len(m["content"]) for m in items if isinstance(m, dict) and isinstance(m.get("content"), list))
    if blocks > config.max_content_blocks:
        raise GatewayRequestError(f"too many content blocks: {blocks} > {config.max_content_blocks} "
                                  f"(gateway.max_content_blocks)")  # fmt: skip


def json_depth(value: Any, limit: int) -> int:
    """Nesting depth of ``value`` (containers only), stopping once past ``limit``."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def check_request(req: CanonicalRequest, config: GatewayConfig, renderer: PromptRenderer, context_limit: int,
                  checked: dict[int, Any] | None = None) -> None:
    """Nesting, length floor and tool-history consistency of a translated request.

    ``checked``: the session's cache of objects whose nesting already passed (id ->
    object, held so the id stays theirs). The CLIs resend the whole history and the
    translation memo hands back the same objects for unchanged messages and tools, so
    each schema and each tool input is walked once per session, not once per request."""
    limit = config.max_json_depth
    checked = {} if checked is None else checked
    if id(req.tools) not in checked:
        for tool in req.tools:
            fn = tool.get("function") or {}
            if json_depth(fn.get("parameters"), limit) > limit:
                raise GatewayRequestError(f"tool {fn.get('name')!r}: schema nested deeper than {limit} "
                                          f"(gateway.max_json_depth)")  # fmt: skip
        checked[id(req.tools)] = req.tools
    issued: set[str] = set()
    chars = 0
    for i, msg in enumerate(req.messages):
        role = msg.get("role")
        if role in _CERTAIN_ROLES:
            chars += len(msg.get("content") or "")
        if role == "tool" and msg.get("tool_call_id") not in issued:
            raise GatewayRequestError(f"message {i}: tool result for unknown tool call id {msg.get('tool_call_id')!r} "
                                      f"(no earlier assistant message of this request made that call)")  # fmt: skip
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") or {}
            args = fn.get("arguments")
            if not isinstance(args, dict):
                raise GatewayRequestError(f"message {i}: tool call {call.get('id')!r} ({fn.get('name')!r}): "
                                          f"its input must be a JSON object, got {type(args).__name__}")  # fmt: skip
            if id(args) not in checked:
                if json_depth(args, limit) > limit:
                    raise GatewayRequestError(f"message {i}: tool call {call.get('id')!r}: input nested deeper "
                                              f"than {limit} (gateway.max_json_depth)")  # fmt: skip
                checked[id(args)] = args
            issued.add(call.get("id"))
    floor = renderer.token_floor(chars)
    if chars > bounded_chars(context_limit) and floor > context_limit:
        raise PromptTooLong(context_limit, f"its {chars} characters of messages are at least {floor} tokens")
