"""Simulator test helpers: the real CLIs' tool vocabularies (captured once, in tests/fixtures/engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "engine"


def chat_tools(harness: str) -> list[dict[str, Any]]:
    """The CLI's captured tool list, as chat-template function schemas."""
    raw = json.loads((FIXTURES / f"tools_{harness}.json").read_text())
    out = []
    for t in raw:
        if harness == "claude_code":
            out.append({"type": "function", "function": {
                "name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]}})
        elif harness == "codex":
            if t.get("type") == "function":
                out.append({"type": "function", "function": {
                    "name": t["name"], "description": t.get("description", ""), "parameters": t["parameters"]}})
        else:
            out.append(t)
    return out
