"""The model's own tool-call and reasoning formats: render and parse, by name.

A small registry (``get_format(name)``) of the formats farm supports:

- ``hermes`` (Qwen2.5 / Qwen3 / Hermes): one JSON object per call,
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, calls separated by
  ``\\n`` -- byte-identical to what the Qwen3 chat template renders for an assistant
  message with ``tool_calls`` (``tojson`` = ``json.dumps`` with default separators).
- ``qwen3_coder`` (Qwen3-Coder XML):
  ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>``;
  string values are written raw, others as JSON.

Reasoning is split off first (``<think>...</think>``), also when the chat template
pre-filled ``<think>`` in the generation prompt so the output starts inside reasoning
(``parse(text, in_reasoning=True)``).

Parsing never raises: a malformed call (bad JSON, no name, unclosed block) stays in
``content`` as text and adds an entry to ``errors`` (the gateway flags the turn).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call the model made; ``arguments`` is a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """Model output split into what the CLI sees."""

    content: str
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()


class ToolCallFormat(Protocol):
    name: str

    def render(self, calls: Iterable[ToolCall]) -> str:
        """Calls as the model writes them (no leading separator)."""
        ...

    def parse(
        self,
        text: str,
        *,
        in_reasoning: bool = False,
        tools: list[dict[str, Any]] | None = None,
        make_id: Callable[[], str] = new_call_id,
    ) -> ParsedOutput:
        """Split ``text`` into reasoning, content and tool calls."""
        ...


def split_reasoning(text: str, *, in_reasoning: bool = False) -> tuple[str | None, str]:
    """``(reasoning or None, rest)``.

    ``<think>`` at the start opens reasoning; ``</think>`` closes it (also without an
    opening tag: the template pre-filled it). Output that starts in reasoning and never
    closes it (cut by length) is all reasoning.
    """
    body = text
    head = body.lstrip()
    if head.startswith(THINK_OPEN):
        body, in_reasoning = head[len(THINK_OPEN):], True
    if THINK_CLOSE in body and (in_reasoning or THINK_OPEN not in body):
        reasoning, _, rest = body.partition(THINK_CLOSE)
        return reasoning.strip("\n"), rest.lstrip("\n")
    if in_reasoning:
        return body.strip("\n"), ""
    return None, text


def _split_blocks(text: str) -> tuple[list[str], list[str | None], list[str]]:
    """Text outside ``<tool_call>`` blocks, the blocks' bodies (None = unclosed), raw blocks."""
    outside: list[str] = []
    bodies: list[str | None] = []
    raws: list[str] = []
    pos = 0
    while True:
        start = text.find(CALL_OPEN, pos)
        if start < 0:
            outside.append(text[pos:])
            break
        outside.append(text[pos:start])
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        if end < 0:
            bodies.append(None)
            raws.append(text[start:])
            outside.append("")
            break
        bodies.append(text[start + len(CALL_OPEN):end])
        raws.append(text[start:end + len(CALL_CLOSE)])
        pos = end + len(CALL_CLOSE)
    return outside, bodies, raws


def _assemble(
    text: str,
    reasoning: str | None,
    decode: Callable[[str], tuple[str, dict[str, Any]]],
    make_id: Callable[[], str],
) -> ParsedOutput:
    outside, bodies, raws = _split_blocks(text)
    if not bodies:
        return ParsedOutput(content=text, reasoning=reasoning)
    pieces: list[str] = [outside[0]]
    calls: list[ToolCall] = []
    errors: list[str] = []
    for body, raw, after in zip(bodies, raws, outside[1:]):
        if body is None:
            errors.append("unclosed <tool_call> block")
            pieces.append(raw)
        else:
            try:
                name, args = decode(body)
            except (ValueError, TypeError, KeyError) as exc:
                errors.append(f"malformed tool call: {exc}")
                pieces.append(raw)
            else:
                calls.append(ToolCall(id=make_id(), name=name, arguments=args))
        pieces.append(after)
    content = "".join(p for p in pieces).strip("\n") if calls else "".join(pieces)
    if calls and not content.strip():
        content = ""
    return ParsedOutput(content=content, reasoning=reasoning, tool_calls=tuple(calls), errors=tuple(errors))


class HermesFormat:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``."""

    name = "hermes"

    def render(self, calls: Iterable[ToolCall]) -> str:
        return "\n".join(
            CALL_OPEN + "\n" + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            + "\n" + CALL_CLOSE
            for c in calls
        )

    @staticmethod
    def _decode(body: str) -> tuple[str, dict[str, Any]]:
        obj = json.loads(body.strip())
        if not isinstance(obj, dict):
            raise ValueError("tool call is not a JSON object")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("tool call has no name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ValueError("tool call arguments are not a JSON object")
        return name, args

    def parse(self, text: str, *, in_reasoning: bool = False, tools: list[dict[str, Any]] | None = None,
              make_id: Callable[[], str] = new_call_id) -> ParsedOutput:
        reasoning, rest = split_reasoning(text, in_reasoning=in_reasoning)
        return _assemble(rest, reasoning, self._decode, make_id)


_FUNC_RE = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


def _param_types(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(fn.get("name"), str) and isinstance(props, dict):
            out[fn["name"]] = props
    return out


def _convert(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter value: raw string for string params, JSON where it parses otherwise."""
    kind = (schema or {}).get("type")
    if kind == "string" or (isinstance(kind, list) and "string" in kind and len(kind) == 1):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class Qwen3CoderFormat:
    """``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>``."""

    name = "qwen3_coder"

    @staticmethod
    def _value(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)

    def render(self, calls: Iterable[ToolCall]) -> str:
        out = []
        for c in calls:
            params = "".join(
                f"<parameter={k}>\n{self._value(v)}\n</parameter>\n" for k, v in c.arguments.items()
            )
            out.append(f"{CALL_OPEN}\n<function={c.name}>\n{params}</function>\n{CALL_CLOSE}")
        return "\n".join(out)

    def parse(self, text: str, *, in_reasoning: bool = False, tools: list[dict[str, Any]] | None = None,
              make_id: Callable[[], str] = new_call_id) -> ParsedOutput:
        reasoning, rest = split_reasoning(text, in_reasoning=in_reasoning)
        types = _param_types(tools)

        def decode(body: str) -> tuple[str, dict[str, Any]]:
            m = _FUNC_RE.match(body)
            if not m:
                raise ValueError("no <function=...>...</function> in tool call")
            name = m.group(1).strip()
            props = types.get(name, {})
            args: dict[str, Any] = {}
            for key, raw in _PARAM_RE.findall(m.group(2)):
                raw = raw[1:] if raw.startswith("\n") else raw
                raw = raw[:-1] if raw.endswith("\n") else raw
                key = key.strip()
                args[key] = _convert(raw, props.get(key))
            leftover = _PARAM_RE.sub("", m.group(2)).strip()
            if leftover:
                raise ValueError(f"unexpected text inside <function={name}>")
            return name, args

        return _assemble(rest, reasoning, decode, make_id)


_FORMATS: dict[str, ToolCallFormat] = {f.name: f for f in (HermesFormat(), Qwen3CoderFormat())}


def get_format(name: str) -> ToolCallFormat:
    """The registered format called ``name`` (``hermes`` | ``qwen3_coder``)."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown tool-call format {name!r}; known: {sorted(_FORMATS)}") from None


def format_names() -> list[str]:
    return sorted(_FORMATS)
