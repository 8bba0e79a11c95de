"""Django's own runner: ``./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1
<labels>`` (unittest's verbose lines under Django's runner).

Ids are what SWE-bench's ``parse_log_django`` lists, so rows grade as they come: the text
before `` ... <status>`` on the line that holds the status, which is the test's
``name (module.Class[.name])`` or, for a test with a docstring, the docstring's first line
(unittest prints it on a line of its own); the ``FAIL:`` / ``ERROR:`` sections give the
bare method name. A test that printed between `` ... `` and ``ok`` passes on the ``ok``
line. Expected failures and unexpected successes are not read (SWE-bench does not list
them). A later line for the same id wins.
"""

from __future__ import annotations

import re

from farm.grading.parsers.base import TestStatus, register

_PASS_SUFFIXES = (" ... ok", " ... OK", " ...  OK")
# The one test (django__django-7188) whose name follows a migration's progress on one line.
_MIGRATION_PREFIX = "Applying sites.0002_alter_domain_unique...test_no_migrations"
# A test's "... ok" split from its name by Django's own start-up chatter (on the whole log).
_INTERRUPTED = (
    re.compile(r"^(.*?)\s\.\.\.\sTesting against Django installed in (?s:.*?) silenced\)\.\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sInternal Server Error: /(.*)/\nok$", re.M),
    re.compile(r"^(.*?)\s\.\.\.\sSystem check identified no issues \(0 silenced\)\nok$", re.M),
)


@register("django")
def parse_django(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    previous: str | None = None  # the last test whose line held " ... "
    for raw in output.split("\n"):
        line = raw.strip()
        if "--version is equivalent to version" in line:  # admin_scripts prints this test over two lines
            out["--version is equivalent to version"] = TestStatus.PASSED
        if " ... " in line:
            previous = line.split(" ... ")[0]
        for suffix in _PASS_SUFFIXES:
            if line.endswith(suffix):
                if line.startswith(_MIGRATION_PREFIX):
                    line = line.split("...", 1)[-1].strip()
                out[line.rsplit(suffix, 1)[0]] = TestStatus.PASSED
                break
        if " ... skipped" in line:
            out[line.split(" ... skipped")[0]] = TestStatus.SKIPPED
        if line.endswith(" ... FAIL"):
            out[line.split(" ... FAIL")[0]] = TestStatus.FAILED
        if line.startswith("FAIL:"):
            out[line.split()[1].strip()] = TestStatus.FAILED
        if line.endswith(" ... ERROR"):
            out[line.split(" ... ERROR")[0]] = TestStatus.ERROR
        if line.startswith("ERROR:"):
            out[line.split()[1].strip()] = TestStatus.ERROR
        if line.startswith("ok") and previous is not None:
            out[previous] = TestStatus.PASSED  # the test printed between " ... " and its "ok"
    for pattern in _INTERRUPTED:
        for m in pattern.finditer(output):
            out[m.group(1)] = TestStatus.PASSED
    return out
