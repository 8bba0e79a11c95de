#!/usr/bin/env python
"""Request-body validation benchmark (not a test): what validating a CLI's request body
costs per turn, on a Claude Code ``/v1/messages`` body of a ~64K-token history (the 24
tools of the capture, then tool_use / tool_result turns of ~40-line outputs until the
text reaches 4 characters per token; ``--tokens`` sets the size).

Side by side, CPU time (process time, gc paused, median of ``--reps``) of one body:

- ``loads``: ``orjson.loads`` of the raw bytes (the gateway does it once per request).
- ``hand``: the envelope checks the gateway made by hand before its pydantic models
  (type checks of messages, n, stream, max_tokens, temperature, top_p, stop, ...).
- ``envelope``: ``parse_body(AnthropicBody, body)``: the model the gateway uses (scalar
  fields typed, ``messages`` / ``tools`` kept as raw lists).
- ``full``: a complete typed model of the Messages API (every message and content block
  validated into a model, a discriminated union on ``type``), from the decoded dict, and
  ``full_json``: the same from the raw bytes (``model_validate_json``, no orjson pass).
- ``turn``: the whole ``AnthropicProtocol.parse`` with the session's warm translation
  memo (what a turn costs after the first), which includes ``envelope``.

Last line: ``bench_bodies: tokens=... body_kb=... loads_us=... hand_us=... envelope_us=...
full_us=... full_json_us=... turn_us=... envelope_added_us=...``
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field

from farm.gateway.anthropic import AnthropicProtocol
from farm.gateway.bodies import AnthropicBody, parse_body
from farm.gateway.canonical import TranslationMemo

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "fixtures" / "captures" / "claude" / "02-main-turn1.json"
WORDS = ("def return import self value file path test error assert result list dict string "
         "config parse render token model session request reply stream index line count").split()


def history_body(tokens: int) -> dict[str, Any]:
    cap = json.loads(CAPTURE.read_text())["body"]
    body = {k: v for k, v in cap.items() if k != "messages"}
    body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "Fix the failing test in calc.py"}]}]
    rng, n = random.Random(0), 0
    while len(orjson.dumps(body["messages"])) < tokens * 4:
        n += 1
        out = "\n".join(f"{i:4d}  " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))) for i in range(40))
        body["messages"].append({"role": "assistant", "content": [
            {"type": "text", "text": f"I'll read the next part of the file (step {n})."},
            {"type": "tool_use", "id": f"toolu_{n:04d}", "name": "Bash",
             "input": {"command": f"sed -n '{n * 60},{n * 60 + 60}p' src/calc.py", "description": "Read"}}]})
        body["messages"].append({"role": "user", "content": [
            {"tool_use_id": f"toolu_{n:04d}", "type": "tool_result", "content": out, "is_error": False}]})
    return body


def hand_envelope(body: Any) -> None:
    """The checks the protocol module made by hand (kept here as the baseline)."""
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise ValueError("messages: a non-empty list is required")
    if not isinstance(body.get("model"), (str, type(None))) or not isinstance(body.get("stream"), (bool, type(None))):
        raise ValueError("model / stream")
    for key in ("max_tokens",):
        val = body.get(key)
        if val is not None and (isinstance(val, bool) or not isinstance(val, int) or val < 1):
            raise ValueError(key)
    for key in ("temperature", "top_p"):
        val = body.get(key)
        if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float))):
            raise ValueError(key)
    stop = body.get("stop_sequences")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise ValueError("stop_sequences")
    if not isinstance(body.get("system"), (str, list, type(None))) or not isinstance(body.get("tools"), (list, type(None))):
        raise ValueError("system / tools")


# ---- the competitor: every message and block a model ------------------------------------
class _M(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class TextBlock(_M):
    type: Literal["text"]
    text: str


class ThinkingBlock(_M):
    type: Literal["thinking"]
    thinking: str


class ToolUseBlock(_M):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_M):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


Block = Annotated[Union[TextBlock, ThinkingBlock, ToolUseBlock, ToolResultBlock], Field(discriminator="type")]


class FullMessage(_M):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class FullTool(_M):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class FullBody(_M):
    model: str | None = None
    messages: list[FullMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[FullTool] | None = None
    max_tokens: int | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop_sequences: str | list[str] | None = None


def cpu_us(fn: Any, reps: int) -> float:
    times = []
    gc.disable()
    try:
        fn()
        for _ in range(reps):
            t0 = time.process_time_ns()
            fn()
            times.append((time.process_time_ns() - t0) / 1e3)
    finally:
        gc.enable()
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64_000)
    parser.add_argument("--reps", type=int, default=51)
    parser.add_argument("--quick", action="store_true",
                        help="the smallest size (a 4K-token body, 5 reps): what the suite runs")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.reps = 4_000, 5
    body = history_body(args.tokens)
    raw = orjson.dumps(body)
    decoded = orjson.loads(raw)
    proto, memo = AnthropicProtocol(), TranslationMemo()
    proto.parse(orjson.loads(raw), {}, memo)  # warm: every message translated once, as after turn 1
    assert FullBody.model_validate(decoded).messages and parse_body(AnthropicBody, decoded).messages
    fig = {
        "loads": cpu_us(lambda: orjson.loads(raw), args.reps),
        "hand": cpu_us(lambda: hand_envelope(decoded), args.reps),
        "envelope": cpu_us(lambda: parse_body(AnthropicBody, decoded), args.reps),
        "full": cpu_us(lambda: FullBody.model_validate(decoded), args.reps),
        "full_json": cpu_us(lambda: FullBody.model_validate_json(raw), args.reps),
        "turn": cpu_us(lambda: proto.parse(orjson.loads(raw), {}, memo), args.reps),
    }
    print(f"{len(body['messages'])} messages, {len(raw) // 1024} KB body; CPU per body, median of {args.reps}:")
    for name, us in fig.items():
        print(f"  {name:10s} {us:9.1f} us")
    figures = " ".join(f"{k}_us={v:.1f}" for k, v in fig.items())
    print(f"bench_bodies: tokens={args.tokens} body_kb={len(raw) // 1024} {figures} "
          f"envelope_added_us={fig['envelope'] - fig['hand']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
