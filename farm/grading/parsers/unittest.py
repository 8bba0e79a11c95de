"""unittest's ``-v`` output: ``test_x (pkg.mod.Class.test_x) ... ok``, also the pre-3.11
``(pkg.mod.Class)`` form, docstring lines and the ``FAIL:``/``ERROR:`` sections; ids are
``pkg.mod.Class.test_x``. ``junit``: JUnit XML (the task's ``test_report_file``); ids are
``classname.name``."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from farm.grading.parsers.base import ANSI, TestStatus, put, register

_STATUS = {
    "ok": TestStatus.PASSED,
    "FAIL": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "expected failure": TestStatus.XFAIL,
    "unexpected success": TestStatus.XPASS,
}
_HEAD = re.compile(r"^(\w+) \(([\w.]+)\)")
# "... ok", or "... <what the test wrote to stderr> ok"
_RESULT = re.compile(r"\.\.\. (?:.*\s)?(ok|FAIL|ERROR|expected failure|unexpected success|skipped\b.*)$")
_SECTION = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)")


def _ut_id(method: str, where: str) -> str:
    return where if where.endswith("." + method) else f"{where}.{method}"


def _ut_status(word: str) -> TestStatus:
    return TestStatus.SKIPPED if word.startswith("skipped") else _STATUS[word]


@register("unittest")
def parse_unittest(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    pending: str | None = None  # a test whose "... status" has not come yet
    for raw in output.splitlines():
        line = ANSI.sub("", raw).rstrip()
        m = _SECTION.match(line)
        if m:
            put(out, _ut_id(m.group(2), m.group(3)), TestStatus.FAILED if m.group(1) == "FAIL" else TestStatus.ERROR)
            pending = None
            continue
        head = _HEAD.match(line)
        result = _RESULT.search(line)
        if head:
            pending = _ut_id(head.group(1), head.group(2))
        if result and pending:
            put(out, pending, _ut_status(result.group(1)))
            pending = None
        elif pending and not head and line.strip() in _STATUS:
            # The test printed something after "... ": the status lands on a line of its own.
            put(out, pending, _STATUS[line.strip()])
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
            put(out, test_id, status)
    return out
