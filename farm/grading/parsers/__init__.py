"""Test log parsers: a test run's output (and an optional report file) -> {test id: TestStatus}.

A task's ``log_parser`` names a format (:func:`log_format`): farm's own ones —

- ``pytest``: ``-rA`` summary and ``-v`` lines; ids are pytest node ids (``pytest.py``);
- ``unittest`` (``-v`` lines; ``pkg.mod.Class.test_x``), ``junit`` (JUnit XML, the task's
  ``test_report_file``; ``classname.name``) (``unittest.py``), ``r2e`` (pytest with
  R2E-Gym's names);
- ``django`` (``tests/runtests.py --verbosity 2``) and ``sympy`` (``bin/test -C --verbose``),
  whose ids are SWE-bench's (``django.py``, ``sympy.py``) —

or any of SWE-bench's names (``parse_log_<name>``, ``swebench.py``), which reads with the
matching format and lists ids the way SWE-bench's parser of that name does. Listed ids meet
farm's statuses in one place, :class:`TestIds` (``ids.py``). Add a format with
``@register("name")``. A test reported several times by farm's own formats keeps its worst
status (a pass followed by a teardown error is an error).
"""

from __future__ import annotations

import difflib

from farm.grading.parsers.base import FORMATS, PARSERS, PASSING, IdRule, LogFormat, LogParser, TestStatus, register
from farm.grading.parsers.django import parse_django
from farm.grading.parsers.ids import TestIds, fill_gaps, listed_id
from farm.grading.parsers.pytest import parse_pytest, parse_r2e
from farm.grading.parsers.swebench import OTHER_LANGUAGES, PYTHON
from farm.grading.parsers.sympy import parse_sympy
from farm.grading.parsers.unittest import parse_junit, parse_unittest
from farm.tasks.formats import RowError
from farm.tasks.model import Task


def log_format(name: str) -> LogFormat:
    """The format a ``log_parser`` name stands for; KeyError with a precise message if none."""
    if name in FORMATS:
        return FORMATS[name]
    if name in PYTHON:
        base, ids = PYTHON[name]
        return LogFormat(name=name, parse=FORMATS[base].parse, ids=ids, pytest=FORMATS[base].pytest)
    raise KeyError(unknown_parser_message(name))


def unknown_parser_message(name: str) -> str:
    if name in OTHER_LANGUAGES:
        return (
            f"log parser {name!r} is SWE-bench's for {OTHER_LANGUAGES[name]} test runners (SWE-bench "
            "Multilingual/Multimodal); farm reads Python runners only: pytest, unittest, Django, SymPy"
        )
    known = sorted(FORMATS) + sorted(PYTHON)
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown log parser {name!r} (farm's: {', '.join(sorted(FORMATS))}; or SWE-bench's parse_log_<name>){hint}"


def check_log_parser(task: Task) -> None:
    """``load_tasks``' check: RowError naming ``log_parser`` when farm cannot read it."""
    if task.kind != "swe":
        return
    try:
        log_format(task.log_parser)
    except KeyError as exc:
        raise RowError("log_parser", str(exc.args[0])) from None


def get_parser(name: str) -> LogParser:
    """The parse function of a ``log_parser`` name (KeyError if unknown)."""
    return log_format(name).parse


__all__ = [
    "FORMATS", "PARSERS", "PASSING", "IdRule", "LogFormat", "LogParser", "TestIds", "TestStatus", "check_log_parser",
    "fill_gaps", "get_parser",
    "listed_id", "log_format", "parse_django", "parse_junit", "parse_pytest", "parse_r2e", "parse_sympy",
    "parse_unittest", "register", "unknown_parser_message",
]  # fmt: skip
