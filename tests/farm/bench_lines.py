"""A benchmark's last line against what its docstring promises (scripts/bench_*.py end with
one line of ``name=value`` figures; the module docstring says which, after "Last line").
Used by the tests that run a benchmark at its smallest size: they check the line's shape,
never its figures (a quick size measures nothing)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

# a figure as the benchmarks print them: a number, nan / inf, or "na" (not measured here)
FIGURE = re.compile(r"-?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|-?nan|-?inf|na")
NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")


def promised(script: Path) -> tuple[str, list[str]]:
    """(prefix, figure names) of the last line the script's module docstring gives."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    at = doc.find("Last line")
    assert at >= 0, f"{script.name}: its docstring does not say what its last line holds"
    rest = doc[at:]
    # the line as a ``literal``, else the paragraph it starts (an indented block after "::")
    m = re.search(r"``(bench_\w+): (.*?)``", rest, re.S) or re.search(r"(bench_\w+): (.*?)(?:\n\s*\n|$)", rest, re.S)
    assert m, f"{script.name}: no 'bench_…: name=…' line after 'Last line' in its docstring"
    return m.group(1), NAME.findall(m.group(2))


def _shape(name: str) -> str:
    """A name with its numbers left out: ``concurrent_2000_errors`` at full size is
    ``concurrent_8_errors`` at the quick one."""
    return re.sub(r"\d+", "N", name)


def assert_last_line(line: str, script: Path) -> dict[str, str]:
    """``line`` is ``<prefix>: name=value ...`` with exactly the names the docstring
    promises, in its order, each value a figure; returns the figures by name."""
    prefix, names = promised(script)
    assert line.startswith(prefix + ": "), f"{script.name}: the last line is not {prefix}'s: {line!r}"
    pairs = [kv.split("=", 1) for kv in line[len(prefix) + 2 :].split()]
    assert all(len(p) == 2 for p in pairs), f"{script.name}: not name=value figures: {line!r}"
    got = [k for k, _ in pairs]
    assert [_shape(n) for n in got] == [_shape(n) for n in names], (
        f"{script.name}: figures {got}, its docstring promises {names}"
    )
    odd = [f"{k}={v}" for k, v in pairs if not FIGURE.fullmatch(v)]
    assert not odd, f"{script.name}: figures that are not numbers: {odd}"
    return dict(pairs)
