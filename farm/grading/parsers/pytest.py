"""pytest's output: ``-rA`` short summary lines (``PASSED tests/t.py::test_x``) and ``-v``
lines (``tests/t.py::test_x PASSED [ 50%]``); ids are pytest node ids, whole (a ``[a - b]``
parameter keeps its spaces). ``r2e``: the same run with R2E-Gym's names (the node id
without the file: ``Class.test_x`` / ``test_x``).

The output is read line by line as SWE-bench reads it (split on newlines only), so an id
holding a newline (pytest's id escaping turned off) ends where SWE-bench's ends.
"""

from __future__ import annotations

import re

from farm.grading.parsers.base import ANSI, IdRule, TestStatus, put, register

_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+)$")
# "tests/t.py::test_x[a b] SKIPPED (reason)   [ 41%]" (the reason and the progress are optional)
_VERBOSE = re.compile(r"^(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?\s*(?:\[\s*\d+%\])?$")


def _strip_message(text: str) -> str:
    """``t.py::test[a - b] - AssertionError: x`` -> ``t.py::test[a - b]`` (the first
    `` - `` outside brackets ends the id)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and text.startswith(" - ", i):
            return text[:i]
    return text


@register("pytest", ids=IdRule.CUT, pytest=True)
def parse_pytest(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    for raw in output.split("\n"):
        line = ANSI.sub("", raw).rstrip()
        m = _SUMMARY.match(line)
        if m:
            rest = m.group(2)
            if rest.startswith("["):  # "SKIPPED [1] file.py:12: reason": no node id
                continue
            put(out, _strip_message(rest), TestStatus(m.group(1)))
            continue
        m = _VERBOSE.match(line)
        if m:
            put(out, m.group(1), TestStatus(m.group(2)))
    return out


@register("r2e")
def parse_r2e(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    for node_id, status in parse_pytest(output).items():
        parts = node_id.split("::")
        put(out, ".".join(parts[1:]) if len(parts) > 1 else node_id, status)
    return out
