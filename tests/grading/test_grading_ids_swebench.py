"""Listed ids as SWE-bench makes them, checked against SWE-bench's own parsers on real runs.

Hypothesis writes pytest files whose parametrize ids are awkward (spaces, newlines,
brackets, colons, ``' - '``, unicode, absolute paths, ``MouseButton.LEFT``, ``[1m``), with
tests that pass, fail, error in setup, skip, xfail and xpass; real pytest runs them with
``-rA`` and farm's probe loaded (sometimes with pytest's id escaping turned off, so ids hold
real newlines). For every SWE-bench parser name of the pytest family, every id SWE-bench's
parser (the ``swebench`` package: the oracle) lists from that output must resolve, through
farm's statuses (the probe's node ids and farm's stdout parse), to the status SWE-bench
gives it (for an id v2 lists with a `` - <message>`` tail, which farm does not keep: to the
same verdict). And ids an older parser cut (``parse_log_pytest``) must resolve under the v2
names to the verdict SWE-bench's grading gives them (``_resolve_case``), except that farm
resolves an exact node id to its test where SWE-bench finds nothing (see ids.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from swebench.harness import grading as swebench_grading  # the oracle: a dev dependency
from swebench.harness import log_parsers as swebench_parsers

from farm.grading.parsers import TestIds, fill_gaps, log_format, parse_pytest
from testkit.probe_run import run_with_probe
from farm.grading.report import MISSING


NAMES = ["parse_log_pytest", "parse_log_sqlfluff", "parse_log_pytest_options", "parse_log_pydicom",
         "parse_log_pytest_v2", "parse_log_astropy", "parse_log_matplotlib", "parse_log_seaborn"]  # fmt: skip
OUTCOMES = ["pass", "fail", "setup_error", "skip", "xfail", "xpass"]

# Pieces of ids real suites have (sqlfluff's SQL, pydicom's paths, matplotlib's enums, astroid's code).
_PIECES = st.sampled_from([
    " ", "  ", " - ", "\n", "\n    ", "\t", "[", "]", "[1]", ":", "::", "noqa:", "select id from tbl;", "a", "b",
    "x", "-", "é", "Ж", "\u3000", "\u2028", "/tmp/data/f.dcm", "//srv/x", "MouseButton.LEFT", "MouseButton.RIGHT",
    "[1m", "(", ")", "'", '"', "*", ",", ".", "0", "9",
])  # fmt: skip
_IDS = st.lists(_PIECES, min_size=1, max_size=6).map("".join)
_CASES = st.lists(st.tuples(_IDS, st.sampled_from(OUTCOMES)), min_size=1, max_size=8)
_SUITE = st.tuples(st.lists(_CASES, min_size=1, max_size=3), st.booleans())

_HEADER = '''import pytest


@pytest.fixture
def outcome(request):
    if request.param == "setup_error":
        raise RuntimeError("fixture broke")
    return request.param


def check(outcome):
    if outcome == "fail":
        raise AssertionError("boom")
    if outcome == "skip":
        pytest.skip("not today")
    if outcome == "xfail":
        pytest.xfail("known")
'''


def suite_source(functions: list[list[tuple[str, str]]]) -> str:
    parts = [_HEADER]
    for n, cases in enumerate(functions):
        marks = ", ".join(
            f"pytest.param({o!r}, id={i!r}, marks=pytest.mark.xfail(reason='xp', strict=False))"
            if o == "xpass" else f"pytest.param({o!r}, id={i!r})"
            for i, o in cases
        )  # fmt: skip
        parts.append(
            f"\n\n@pytest.mark.parametrize('outcome', [{marks}], indirect=True)\n"
            f"def test_f{n}(outcome):\n    check(outcome)\n"
        )
    return "".join(parts)


def run_suite(root: Path, functions: list[list[tuple[str, str]]], unescaped: bool) -> tuple[str, dict]:
    """A real `pytest -rA` run with farm's probe: (its output, farm's statuses)."""
    (root / "test_awkward.py").write_text(suite_source(functions), encoding="utf-8")
    unescape = "disable_test_id_escaping_and_forfeit_all_rights_to_community_support = true\n"
    (root / "pytest.ini").write_text("[pytest]\n" + (unescape if unescaped else ""))
    # Only pytest and the probe (the venv's other plugins cost seconds per run here).
    base = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # fmt: skip
    res, seen = run_with_probe(root, ["test_awkward.py"], scratch=root / "probe", env=base, timeout=120)
    out = res.stdout + "\n" + res.stderr
    assert "short test summary info" in out, out[-2000:]
    assert seen.finished and not seen.forged_lines
    return out, fill_gaps(seen.statuses, parse_pytest(out))  # as the grader merges them


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suite=_SUITE)
def test_swebench_listed_ids_resolve_to_swebench_statuses(tmp_path_factory: pytest.TempPathFactory, suite) -> None:
    functions, unescaped = suite
    out, statuses = run_suite(tmp_path_factory.mktemp("ids"), functions, unescaped)
    for name in NAMES:
        listed = swebench_parsers.PARSER_REGISTRY[name](out, None)
        ids = TestIds(statuses, log_format(name).ids)
        for test_id, status in listed.items():
            got = ids.status_of(test_id, MISSING)
            if test_id in ids.listed or test_id in statuses:
                assert got == status, (name, test_id, listed, statuses)
            else:  # listed with a " - <message>" tail (v2), which farm does not keep: the verdict agrees
                assert verdict(got) == verdict(status), (name, test_id, listed, statuses)
    # Ids an older parser cut, graded under a v2 name: SWE-bench's _resolve_case decides.
    v2 = swebench_parsers.PARSER_REGISTRY["parse_log_pytest_v2"](out, None)
    full = TestIds(statuses, log_format("parse_log_pytest_v2").ids)
    for test_id in swebench_parsers.PARSER_REGISTRY["parse_log_pytest"](out, None):
        key = swebench_grading._resolve_case(test_id, v2)
        if key is None and test_id in statuses:
            continue  # an exact node id resolves to its test in farm (v2 may list it with a message): ids.py
        want = verdict(MISSING if key is None else v2[key])
        assert verdict(full.status_of(test_id, MISSING)) == want, (test_id, v2, statuses)


def verdict(status: str) -> str:
    """What a status means for grading: passing, maintained (a PASS_TO_PASS skip) or failing
    (an exact id that errored counts as failing where SWE-bench, not finding it, says missing)."""
    return "pass" if status in ("PASSED", "XFAIL") else "skip" if status == "SKIPPED" else "fail"
