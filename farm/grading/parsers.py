"""Test log parsers: test output (and an optional report file) -> {test id: TestStatus}.

A small registry: ``get_parser(name)``; add one with ``@register("name")``. Shipped:

- ``pytest``: ``-rA`` short summary lines (``PASSED tests/t.py::test_x``) and ``-v``
  lines (``tests/t.py::test_x PASSED [ 50%]``); ids are pytest node ids.
- ``unittest``: ``-v`` lines (``test_x (pkg.mod.Class.test_x) ... ok``, also the pre-3.11
  ``(pkg.mod.Class)`` form, docstring lines and the ``FAIL:``/``ERROR:`` sections); ids
  are ``pkg.mod.Class.test_x``.
- ``junit``: JUnit XML (the task's ``test_report_file``); ids are ``classname.name``.
- ``r2e``: pytest output with R2E-Gym's names (the node id without the file:
  ``Class.test_x`` / ``test_x``).

A test reported several times keeps its worst status (a pass followed by a teardown
error is an error).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from enum import Enum


class TestStatus(str, Enum):
    __test__ = False  # not a pytest test class

    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


PASSING = frozenset({TestStatus.PASSED, TestStatus.XFAIL})
_SEVERITY = {
    TestStatus.SKIPPED: 0,
    TestStatus.XFAIL: 1,
    TestStatus.PASSED: 2,
    TestStatus.XPASS: 3,
    TestStatus.FAILED: 4,
    TestStatus.ERROR: 5,
}

LogParser = Callable[[str, str | None], dict[str, TestStatus]]
PARSERS: dict[str, LogParser] = {}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def register(name: str) -> Callable[[LogParser], LogParser]:
    def deco(fn: LogParser) -> LogParser:
        PARSERS[name] = fn
        return fn

    return deco


def status_of(statuses: dict[str, TestStatus], test_id: str, missing: str) -> str:
    """The status of ``test_id`` (a value), SWE-bench's way: an exact id, else the id cut
    at its first space (parsers that split lines on whitespace report parametrized ids
    with spaces cut there, and those match the listed id by prefix)."""
    if test_id in statuses:
        return statuses[test_id].value
    cut = test_id.split(" ", 1)[0]
    if cut != test_id and cut in statuses:
        return statuses[cut].value
    return missing


def get_parser(name: str) -> LogParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise KeyError(f"unknown log parser {name!r} (known: {', '.join(sorted(PARSERS))})") from None


def _put(out: dict[str, TestStatus], name: str, status: TestStatus) -> None:
    name = name.strip()
    if not name:
        return
    old = out.get(name)
    if old is None or _SEVERITY[status] >= _SEVERITY[old]:
        out[name] = status


def _strip_message(rest: str) -> str:
    """``tests/t.py::test[a - b] - AssertionError: x`` -> ``tests/t.py::test[a - b]``."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and rest.startswith(" - ", i):
            return rest[:i]
    return rest


_PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+)$")
# "tests/t.py::test_x[a b] SKIPPED (reason)   [ 41%]" (the reason and the progress are optional)
_PYTEST_VERBOSE = re.compile(
    r"^(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?\s*(?:\[\s*\d+%\])?$"
)


@register("pytest")
def parse_pytest(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        m = _PYTEST_SUMMARY.match(line)
        if m:
            rest = m.group(2)
            if rest.startswith("["):  # "SKIPPED [1] file.py:12: reason": no node id
                continue
            _put(out, _strip_message(rest), TestStatus(m.group(1)))
            continue
        m = _PYTEST_VERBOSE.match(line)
        if m:
            _put(out, m.group(1), TestStatus(m.group(2)))
    return out


@register("r2e")
def parse_r2e(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    for node_id, status in parse_pytest(output).items():
        parts = node_id.split("::")
        _put(out, ".".join(parts[1:]) if len(parts) > 1 else node_id, status)
    return out


_UT_STATUS = {
    "ok": TestStatus.PASSED,
    "FAIL": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "expected failure": TestStatus.XFAIL,
    "unexpected success": TestStatus.XPASS,
}
_UT_HEAD = re.compile(r"^(\w+) \(([\w.]+)\)")
# "... ok", or "... <what the test wrote to stderr> ok"
_UT_RESULT = re.compile(r"\.\.\. (?:.*\s)?(ok|FAIL|ERROR|expected failure|unexpected success|skipped\b.*)$")
_UT_SECTION = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)")


def _ut_id(method: str, where: str) -> str:
    return where if where.endswith("." + method) else f"{where}.{method}"


def _ut_status(word: str) -> TestStatus:
    return TestStatus.SKIPPED if word.startswith("skipped") else _UT_STATUS[word]


@register("unittest")
def parse_unittest(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    pending: str | None = None  # a test whose "... status" has not come yet
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        m = _UT_SECTION.match(line)
        if m:
            _put(out, _ut_id(m.group(2), m.group(3)), TestStatus.FAILED if m.group(1) == "FAIL" else TestStatus.ERROR)
            pending = None
            continue
        head = _UT_HEAD.match(line)
        result = _UT_RESULT.search(line)
        if head:
            pending = _ut_id(head.group(1), head.group(2))
        if result and pending:
            _put(out, pending, _ut_status(result.group(1)))
            pending = None
        elif pending and not head and line.strip() in _UT_STATUS:
            # The test printed something after "... ": the status lands on a line of its own.
            _put(out, pending, _UT_STATUS[line.strip()])
            pending = None
    return out


@register("junit")
def parse_junit(output: str, report: str | None = None) -> dict[str, TestStatus]:
    """JUnit XML from ``report`` (the task's test_report_file). No report: no tests."""
    out: dict[str, TestStatus] = {}
    if not report or not report.strip():
        return out
    try:
        root = ET.fromstring(report)
    except ET.ParseError:
        return out
    for case in root.iter("testcase"):
        name = case.get("name", "")
        classname = case.get("classname", "")
        test_id = f"{classname}.{name}" if classname else name
        statuses = [TestStatus.PASSED]
        for child in case:
            if child.tag == "failure":
                statuses.append(TestStatus.FAILED)
            elif child.tag == "error":
                statuses.append(TestStatus.ERROR)
            elif child.tag == "skipped":
                statuses.append(TestStatus.XFAIL if child.get("type") == "pytest.xfail" else TestStatus.SKIPPED)
        if len(statuses) > 1:
            statuses.pop(0)  # a child says what happened: PASSED was only the default
        for status in statuses:
            _put(out, test_id, status)
    return out
