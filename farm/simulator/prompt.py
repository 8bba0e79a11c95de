"""Reading a rendered ChatML prompt back: messages, tool schemas, the generation prompt.

The gateway renders prompts with a Qwen3-style template: a system message carrying
``<tools>`` (one JSON schema per line; Qwen3-Coder templates use ``<function><name>``
XML), ``<|im_start|>user`` turns, assistant turns with ``<tool_call>`` blocks, and tool
results as ``<tool_response>`` blocks inside a user turn. The prompt ends with the
generation prompt ``<|im_start|>assistant\\n`` (maybe with ``<think>`` opened, or an
empty think block when thinking is disabled).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TOOLS_RE = re.compile(r"<tools>\n(.*?)\n?</tools>", re.S)
_XML_TOOL_RE = re.compile(r"<function>\s*<name>(.*?)</name>(.*?)</function>", re.S)
_XML_PARAM_RE = re.compile(r"<parameter>\s*<name>(.*?)</name>(?:.*?<type>(.*?)</type>)?", re.S)


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str

    @property
    def is_tool_result(self) -> bool:
        return self.role == "tool" or (self.role == "user" and "<tool_response>" in self.content)


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the prompt offers: its name and parameter schemas (``properties``)."""

    name: str
    properties: dict[str, Any] = field(default_factory=dict)
    required: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ParsedPrompt:
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
    generation_prefix: str  # what the template already wrote after <|im_start|>assistant\n

    @property
    def in_reasoning(self) -> bool:
        """The template opened ``<think>`` and the output starts inside it."""
        head = self.generation_prefix
        return THINK_OPEN in head and THINK_CLOSE not in head.split(THINK_OPEN)[-1]

    @property
    def thinking_disabled(self) -> bool:
        """The template wrote an empty think block (``enable_thinking=False``)."""
        return THINK_CLOSE in self.generation_prefix

    @property
    def prior_assistant_turns(self) -> list[Message]:
        return [m for m in self.messages if m.role == "assistant"]

    def tool(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def last_tool_result(self) -> str | None:
        for m in reversed(self.messages):
            if m.is_tool_result:
                return m.content
            if m.role == "assistant":
                return None
        return None


def _tool_from_json(obj: Any) -> ToolSpec | None:
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function") if isinstance(obj.get("function"), dict) else obj
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        return None
    params = fn.get("parameters") or fn.get("input_schema") or {}
    props = params.get("properties") if isinstance(params, dict) else None
    required = params.get("required") if isinstance(params, dict) else None
    return ToolSpec(
        name=name,
        properties=props if isinstance(props, dict) else {},
        required=tuple(r for r in (required or ()) if isinstance(r, str)),
    )


def parse_tools(system: str) -> tuple[ToolSpec, ...]:
    """Tool schemas from the ``<tools>`` block (JSON lines, or Qwen3-Coder XML)."""
    m = _TOOLS_RE.search(system)
    if not m:
        return ()
    block = m.group(1)
    tools: list[ToolSpec] = []
    for line in block.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            spec = _tool_from_json(json.loads(line))
        except ValueError:
            continue
        if spec is not None:
            tools.append(spec)
    if not tools:
        for name, body in _XML_TOOL_RE.findall(block):
            props = {p.strip(): {"type": (t or "string").strip()} for p, t in _XML_PARAM_RE.findall(body)}
            tools.append(ToolSpec(name=name.strip(), properties=props))
    return tuple(tools)


def parse_chatml(prompt: str) -> ParsedPrompt:
    """Split a rendered ChatML prompt into messages, tools and the generation prefix."""
    chunks = prompt.split(IM_START)[1:]
    messages: list[Message] = []
    prefix = ""
    for i, chunk in enumerate(chunks):
        role, _, rest = chunk.partition("\n")
        role = role.strip()
        if IM_END in rest:
            messages.append(Message(role=role, content=rest.split(IM_END, 1)[0]))
        elif i == len(chunks) - 1 and role == "assistant":
            prefix = rest
        else:
            messages.append(Message(role=role, content=rest))
    tools: tuple[ToolSpec, ...] = ()
    for m in messages:
        if m.role == "system" and "<tools>" in m.content:
            tools = parse_tools(m.content)
            break
    return ParsedPrompt(messages=tuple(messages), tools=tools, generation_prefix=prefix)


def with_reasoning(parsed: ParsedPrompt, reasoning: str, body: str) -> str:
    """The model output: a short think block (closing one the template opened, none
    when thinking is disabled), then ``body``."""
    if parsed.thinking_disabled or not reasoning:
        return body if not parsed.in_reasoning else f"\n</think>\n\n{body}"
    if parsed.in_reasoning:
        return f"{reasoning}\n</think>\n\n{body}"
    return f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n{body}"
