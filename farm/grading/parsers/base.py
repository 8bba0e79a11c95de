"""What every log parser shares: the test statuses, the registry of farm's formats, and
the rule that a test reported several times keeps its worst status."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum



class IdRule(str, Enum):
    """How SWE-bench's parser of a name turns a pytest result line into the id it lists
    (``farm.grading.parsers.ids`` applies them)."""

    EXACT = "exact"  # the parser's own ids are the listed ones (Django, SymPy, unittest, JUnit, R2E)
    CUT = "cut"  # parse_log_pytest: the id up to its first whitespace
    OPTIONS = "options"  # parse_log_pytest_options: cut, and a /path parameter kept as its last part
    FULL = "full"  # parse_log_pytest_v2: the whole id (control characters and "[<n>m" dropped)
    MATPLOTLIB = "matplotlib"  # cut, after MouseButton.LEFT / .RIGHT became 1 / 3
    SEABORN = "seaborn"  # cut, PASSED and FAILED lines only


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
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

LogParser = Callable[[str, str | None], dict[str, TestStatus]]


@dataclass(frozen=True)
class LogFormat:
    """How one ``log_parser`` name reads a test run.

    ``parse``: (output, report file text) -> {test id: status}; ``ids``: how SWE-bench's
    parser of that name lists those ids (``farm.grading.parsers.ids``); ``pytest``: the run
    is pytest's, so farm's probe (exact node ids) decides and the printed output only fills
    gaps."""

    name: str
    parse: LogParser
    ids: IdRule = IdRule.EXACT
    pytest: bool = False


FORMATS: dict[str, LogFormat] = {}
PARSERS: dict[str, LogParser] = {}  # farm's own format names -> their parse function


def register(name: str, *, ids: IdRule = IdRule.EXACT, pytest: bool = False) -> Callable[[LogParser], LogParser]:
    """Register a parser under ``name`` (a task's ``log_parser``)."""

    def deco(fn: LogParser) -> LogParser:
        FORMATS[name] = LogFormat(name=name, parse=fn, ids=ids, pytest=pytest)
        PARSERS[name] = fn
        return fn

    return deco


def put(out: dict[str, TestStatus], name: str, status: TestStatus) -> None:
    """Record ``status`` for ``name`` unless it already has a worse one."""
    name = name.strip()
    if not name:
        return
    old = out.get(name)
    if old is None or _SEVERITY[status] >= _SEVERITY[old]:
        out[name] = status
