"""A run summary (nested JSON) flattened for the loggers: (metric, value) rows for the
summary table, and its numbers under dotted names."""

from __future__ import annotations

from typing import Any


def summary_rows(summary: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """A (nested) summary flattened to (metric, value) rows: the summary table."""
    rows: list[tuple[str, str]] = []
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            rows += summary_rows(value, name + ".")
        elif isinstance(value, list):
            rows.append((name, ", ".join(map(str, value))))
        elif value is not None:
            rows.append((name, str(value)))
    return rows


def scalars(summary: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a (nested) summary, flattened with dotted names."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out
