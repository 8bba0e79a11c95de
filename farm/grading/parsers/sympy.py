"""SymPy's own runner: ``bin/test -C --verbose <files>`` (``sympy.test(..., verbose=True)``
with the cache off: ``SYMPY_USE_CACHE=no``).

Ids are what SWE-bench's ``parse_log_sympy`` lists, so rows grade as they come: a line
``test_x ok`` / ``test_x F`` / ``test_x E`` gives ``test_x`` (the bare function name,
whatever its file); a failure section's header ``____ path/test_f.py:test_x ____`` gives
``path/test_f.py:test_x`` failed. Skips (``s``), expected failures (``f``), unexpected
passes (``X``) and a line that carries the file's ``[OK]`` / ``[FAIL]`` are not read (as
SWE-bench's current parser: SymPy prints the last test of each file that way). A later
line for the same id wins.
"""

from __future__ import annotations

import re

from farm.grading.parsers.base import TestStatus, register

# Anywhere in the log, also across the underscores of a failure section's header.
_SECTION = re.compile(r"_* (.*)\.py:(.*) _*")
_ENDINGS = ((" E", TestStatus.ERROR), (" F", TestStatus.FAILED), (" ok", TestStatus.PASSED))


@register("sympy")
def parse_sympy(output: str, report: str | None = None) -> dict[str, TestStatus]:
    out: dict[str, TestStatus] = {}
    for m in _SECTION.finditer(output):
        out[f"{m.group(1)}.py:{m.group(2)}"] = TestStatus.FAILED
    for raw in output.split("\n"):
        line = raw.strip()
        if not line.startswith("test_"):
            continue
        for ending, status in _ENDINGS:
            if line.endswith(ending):
                out[line.split()[0]] = status
    return out
