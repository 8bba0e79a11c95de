"""The CLIs' JSON-lines output: parse it tolerantly, keep a bounded raw tail."""

from __future__ import annotations

import json
from typing import Any

import orjson


def parse_json_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """JSON objects, one per line; returns (events, number of non-JSON non-empty lines).

    The CLIs print one JSON object per line in their JSON modes; anything else (a
    warning, a truncated last line of a killed process) is counted, not fatal.
    """
    events: list[dict[str, Any]] = []
    other = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                obj = orjson.loads(line)  # a CLI's whole stream, read again each watch round: the fast parser
            except ValueError:
                try:  # what orjson refuses and json takes (NaN, integers past 64 bits)
                    obj = json.loads(line)
                except ValueError:
                    other += 1
                    continue
            if isinstance(obj, dict):
                events.append(obj)
                continue
        other += 1
    return events, other


def tail(text: str, chars: int) -> str:
    if chars <= 0:
        return ""
    return text if len(text) <= chars else text[-chars:]


def last_line(text: str, limit: int = 300) -> str:
    """The last non-empty line of ``text`` (for one-line reasons)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""
