"""The canonical conversation every wire protocol is translated into (and out of).

Canonical messages are plain dicts in the shape chat templates read:

- ``{"role": "system" | "user", "content": str}``
- ``{"role": "assistant", "content": str, "reasoning_content"?: str,
  "tool_calls"?: [{"id", "type": "function", "function": {"name", "arguments": dict}}]}``
- ``{"role": "tool", "tool_call_id": str, "content": str, "is_error"?: True}``

Canonical tools are function schemas ``{"type": "function", "function": {"name",
"description", "parameters"}}``; ``NativeTool`` remembers how to map a call back to
the protocol's own tool kind (Codex's freeform ``custom`` tools, ``namespace`` tools).

Echo matching (:func:`echo_matches`) is how the gateway recognises, in the next
request, the assistant message it returned: the CLIs reorder JSON keys, re-serialize
arguments, change whitespace, drop or rewrite ids, split text and tool calls into
several blocks/items and strip reasoning. None of that breaks the match; a different
text, tool name or argument value does.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal

import orjson

from farm.modeltext.toolcalls import ToolCall, split_reasoning
from farm.trajectory.records import FinishReason, TurnFlag

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class NativeTool:
    """How a canonical tool maps back to the protocol (``custom`` = freeform text input)."""

    kind: Literal["function", "custom"]
    name: str
    namespace: str | None = None


CUSTOM_INPUT = "input"  # the single argument a freeform (custom) tool is given as


@dataclass(slots=True)
class CanonicalRequest:
    """One CLI request, protocol-neutral."""

    protocol: str
    model: str
    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_map: dict[str, NativeTool] = field(default_factory=dict)
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    side_hint: bool = False  # the protocol itself marks this as a side request
    dropped_tools: list[str] = field(default_factory=list)  # tool types we cannot serve (e.g. web_search)
    meta: dict[str, Any] = field(default_factory=dict)

    def system_text(self) -> str:
        return "\n".join(m["content"] for m in self.messages if m.get("role") == "system")


@dataclass(frozen=True, slots=True)
class TurnOutput:
    """A finished turn, ready to be written in any protocol."""

    turn_id: str | None
    content: str
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish: FinishReason
    matched_stop: str | None = None  # the client stop sequence that ended the turn
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    flags: frozenset[TurnFlag] = frozenset()

    @property
    def stop_kind(self) -> Literal["tool_calls", "stop", "length", "stop_sequence"]:
        if self.finish is FinishReason.LENGTH:
            return "length"
        if self.tool_calls:
            return "tool_calls"
        return "stop_sequence" if self.matched_stop else "stop"


# ---- building ----------------------------------------------------------------
def function_tool(name: str, description: str | None, parameters: Any) -> dict[str, Any]:
    params = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    fn: dict[str, Any] = {"name": name}
    if description:
        fn["description"] = description
    fn["parameters"] = params
    return {"type": "function", "function": fn}


def custom_tool(name: str, description: str | None, fmt: Any) -> dict[str, Any]:
    """A freeform tool as a function with one string argument ``input``."""
    detail = ""
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        detail = f" The input must follow this {fmt.get('syntax', '')} grammar:\n{fmt.get('definition', '')}"
    desc = (description or "") + detail
    return function_tool(
        name,
        desc,
        {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string", "description": "the raw freeform input"}},
            "required": [CUSTOM_INPUT],
        },
    )


def tool_call_message(call: ToolCall | dict[str, Any]) -> dict[str, Any]:
    if isinstance(call, ToolCall):
        return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return call


def assistant_message(content: str, reasoning: str | None, calls: Iterable[ToolCall]) -> Message:
    msg: Message = {"role": "assistant", "content": content}
    if reasoning:
        msg["reasoning_content"] = reasoning
    tcs = [tool_call_message(c) for c in calls]
    if tcs:
        msg["tool_calls"] = tcs
    return msg


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as a dict when they are JSON, else the raw string."""
    if isinstance(raw, dict):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            val = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        return val if isinstance(val, dict) else raw
    return raw


class TranslationMemo:
    """Per-session memo of native message -> canonical messages, from the previous request.

    CLIs resend the whole conversation every turn; all but the last few messages are
    equal (``==``, a C-level deep compare) to the previous request's, so their
    translation is reused and the canonical history keeps the same dict objects (which
    makes the prefix comparison of ``history.plan_turn`` nearly free). Translations
    must be context-free (a function of one native message).
    """

    def __init__(self) -> None:
        self._natives: list[Any] = []
        self._frags: list[list[Message]] = []
        self._values: dict[str, tuple[Any, Any]] = {}

    def value(self, key: str, native: Any, fn: Any) -> Any:
        """``fn(native)``, reused while ``native`` equals the previous request's (e.g. the tools)."""
        hit = self._values.get(key)
        if hit is not None and hit[0] == native:
            return hit[1]
        out = fn(native)
        self._values[key] = (native, out)
        return out

    def translate(self, natives: list[Any], fn: Any) -> list[Message]:
        prev_n, prev_f = self._natives, self._frags
        n_prev = len(prev_n)
        frags: list[list[Message]] = []
        for i, native in enumerate(natives):
            if i < n_prev and prev_n[i] == native:
                frags.append(prev_f[i])
            else:
                frags.append(fn(i, native))
        self._natives, self._frags = natives, frags
        return [m for frag in frags for m in frag]


def translate_all(natives: list[Any], fn: Any, memo: TranslationMemo | None) -> list[Message]:
    if memo is not None:
        return memo.translate(natives, fn)
    return [m for i, native in enumerate(natives) for m in fn(i, native)]


def merge_consecutive(messages: list[Message]) -> list[Message]:
    """Merge runs of assistant messages (split text / tool calls) and the leading run of
    system messages (Codex sends several developer items) into one message each."""
    roles = " ".join([m["role"] for m in messages[:2]]) + "|" + " ".join([m["role"] for m in messages])
    if not roles.startswith("system system") and "assistant assistant" not in roles:
        return messages
    out: list[Message] = []
    for m in messages:
        prev = out[-1] if out else None
        if prev is not None and prev["role"] == m["role"] == "assistant":
            merged = dict(prev)
            merged["content"] = _join(prev.get("content", ""), m.get("content", ""))
            r = _join(prev.get("reasoning_content") or "", m.get("reasoning_content") or "")
            if r:
                merged["reasoning_content"] = r
            calls = list(prev.get("tool_calls") or ()) + list(m.get("tool_calls") or ())
            if calls:
                merged["tool_calls"] = calls
            out[-1] = merged
        elif prev is not None and prev["role"] == m["role"] == "system" and len(out) == 1:
            out[-1] = {"role": "system", "content": _join(prev["content"], m["content"], "\n\n")}
        else:
            out.append(m)
    return out


def _join(a: str, b: str, sep: str = "\n") -> str:
    if not a:
        return b
    if not b:
        return a
    return a + sep + b


def tools_digest(tools: list[dict[str, Any]]) -> str:
    if not tools:
        return ""
    return hashlib.blake2b(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS), digest_size=12).hexdigest()


# ---- echo matching -------------------------------------------------------------
def _squash(text: str | None) -> str:
    return "".join((text or "").split())


def _echo_parts(msg: Message) -> tuple[str, str, list[tuple[str, Any]]]:
    content = msg.get("content") or ""
    reasoning = msg.get("reasoning_content") or ""
    if not reasoning and "</think>" in content:
        r, content = split_reasoning(content)
        reasoning = r or ""
    calls = []
    for tc in msg.get("tool_calls") or ():
        fn = tc.get("function", tc)
        args = parse_arguments(fn.get("arguments"))
        calls.append((fn.get("name"), args if isinstance(args, dict) else _squash(str(args))))
    return _squash(content), _squash(reasoning), calls


def echo_matches(ours: Message, echo: Message) -> bool:
    """Is ``echo`` (from the CLI) the assistant message ``ours`` that we returned?"""
    if echo.get("role") != "assistant":
        return False
    c1, r1, k1 = _echo_parts(ours)
    c2, r2, k2 = _echo_parts(echo)
    if c1 != c2 and not (k1 and not c2):  # text may be dropped next to tool calls
        return False
    if r2 and r1 != r2:  # reasoning may be stripped, not changed
        return False
    if k1 == k2:
        return True
    return len(k1) == len(k2) and sorted(map(repr, k1)) == sorted(map(repr, k2))


def is_empty_response(msg: Message | None) -> bool:
    return msg is None or (not (msg.get("content") or "").strip() and not msg.get("tool_calls"))


def messages_equivalent(a: Message, b: Message) -> bool:
    """History comparison: exact, or the same assistant message up to echo tolerance."""
    if a == b:
        return True
    if a.get("role") == b.get("role") == "assistant":
        return echo_matches(a, b)
    return False
