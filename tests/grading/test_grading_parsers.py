"""Log parsers on REAL output: pytest (-rA, -v, JUnit XML) and unittest (-v) run here in temp dirs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from farm.grading.parsers import (
    IdRule, TestIds, TestStatus, get_parser, log_format, parse_junit, parse_pytest, parse_r2e, parse_unittest,
)

S = TestStatus

PYTEST_SUITE = '''
import pytest


def test_pass():
    print("some output")


def test_fail():
    assert 1 == 2


@pytest.fixture
def broken():
    raise RuntimeError("fixture broke")


def test_error(broken):
    pass


@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown broke")


def test_pass_then_teardown_error(bad_teardown):
    pass


@pytest.mark.skip(reason="not today")
def test_skip():
    pass


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False


@pytest.mark.xfail(reason="known")
def test_xpass():
    pass


@pytest.mark.parametrize("value", ["a - b", "x[1]", "plain"])
def test_param(value):
    assert value != "plain"


class TestGroup:
    def test_method(self):
        assert True

    def test_method_fails(self):
        raise ValueError("nope - really")
'''

EXPECTED_PYTEST = {
    "tests/test_suite.py::test_pass": S.PASSED,
    "tests/test_suite.py::test_fail": S.FAILED,
    "tests/test_suite.py::test_error": S.ERROR,
    "tests/test_suite.py::test_pass_then_teardown_error": S.ERROR,
    "tests/test_suite.py::test_xfail": S.XFAIL,
    "tests/test_suite.py::test_xpass": S.XPASS,
    "tests/test_suite.py::test_param[a - b]": S.PASSED,
    "tests/test_suite.py::test_param[x[1]]": S.PASSED,
    "tests/test_suite.py::test_param[plain]": S.FAILED,
    "tests/test_suite.py::TestGroup::test_method": S.PASSED,
    "tests/test_suite.py::TestGroup::test_method_fails": S.FAILED,
}

UNITTEST_SUITE = '''
import unittest


class Alpha(unittest.TestCase):
    def test_ok(self):
        pass

    def test_docstring(self):
        """A docstring shown by -v."""

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    def test_prints(self):
        import sys
        sys.stderr.write("noise ")

    @unittest.skip("not today")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_expected_failure(self):
        self.assertTrue(False)

    @unittest.expectedFailure
    def test_unexpected_success(self):
        pass


class Beta(unittest.TestCase):
    def test_other(self):
        pass
'''

EXPECTED_UNITTEST = {
    "tests.test_ut.Alpha.test_ok": S.PASSED,
    "tests.test_ut.Alpha.test_docstring": S.PASSED,
    "tests.test_ut.Alpha.test_fail": S.FAILED,
    "tests.test_ut.Alpha.test_error": S.ERROR,
    "tests.test_ut.Alpha.test_prints": S.PASSED,
    "tests.test_ut.Alpha.test_skip": S.SKIPPED,
    "tests.test_ut.Alpha.test_expected_failure": S.XFAIL,
    "tests.test_ut.Alpha.test_unexpected_success": S.XPASS,
    "tests.test_ut.Beta.test_other": S.PASSED,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("parsers")
    (root / "tests").mkdir()
    (root / "tests" / "__init__.py").write_text("")
    (root / "tests" / "test_suite.py").write_text(PYTEST_SUITE)
    (root / "tests" / "test_ut.py").write_text(UNITTEST_SUITE)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    return root


def run(project: Path, *args: str) -> str:
    res = subprocess.run(
        [sys.executable, *args], cwd=project, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"},
    )
    return res.stdout + "\n" + res.stderr


@pytest.fixture(scope="module")
def rA_run(project: Path) -> tuple[str, str]:
    """One real `pytest -rA --junitxml` run: (its output, the JUnit XML)."""
    out = run(project, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "--junitxml=junit.xml", "tests/test_suite.py")
    return out, (project / "junit.xml").read_text()


def test_pytest_rA_output(rA_run: tuple[str, str]) -> None:
    out = rA_run[0]
    assert "short test summary info" in out  # really the -rA format
    parsed = parse_pytest(out)
    assert {k: v for k, v in parsed.items() if k in EXPECTED_PYTEST} == EXPECTED_PYTEST
    assert "tests/test_suite.py::test_skip" not in parsed  # -rA prints skips without a node id


def test_pytest_verbose_and_color_output(project: Path) -> None:
    out = run(project, "-m", "pytest", "-v", "--color=yes", "-p", "no:cacheprovider", "tests/test_suite.py")
    assert "\x1b[" in out
    parsed = parse_pytest(out)
    assert parsed["tests/test_suite.py::test_skip"] is S.SKIPPED
    assert parsed["tests/test_suite.py::TestGroup::test_method"] is S.PASSED
    assert parsed["tests/test_suite.py::test_param[plain]"] is S.FAILED
    assert parsed["tests/test_suite.py::test_pass_then_teardown_error"] is S.ERROR


def test_pytest_collection_error(project: Path, tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text("import does_not_exist\n\ndef test_x():\n    pass\n")
    out = run(tmp_path, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "test_broken.py")
    parsed = parse_pytest(out)
    assert parsed == {"test_broken.py": S.ERROR}


def test_unittest_verbose_output(project: Path) -> None:
    out = run(project, "-m", "unittest", "-v", "tests.test_ut")
    assert " ... ok" in out
    assert parse_unittest(out) == EXPECTED_UNITTEST


def test_unittest_old_style_lines() -> None:
    # Python < 3.11 prints "test_x (pkg.mod.Class)"; docstring and late status lines too.
    out = "\n".join(
        [
            "test_a (pkg.mod.Cls) ... ok",
            "test_b (pkg.mod.Cls)",
            "Docstring of b ... FAIL",
            "test_c (pkg.mod.Cls) ... printed stuff",
            "ok",
            "test_d (pkg.mod.Cls) ... skipped 'why'",
            "======================================================================",
            "ERROR: test_e (pkg.mod.Cls)",
        ]
    )
    assert parse_unittest(out) == {
        "pkg.mod.Cls.test_a": S.PASSED,
        "pkg.mod.Cls.test_b": S.FAILED,
        "pkg.mod.Cls.test_c": S.PASSED,
        "pkg.mod.Cls.test_d": S.SKIPPED,
        "pkg.mod.Cls.test_e": S.ERROR,
    }


def test_junit_xml_from_pytest(rA_run: tuple[str, str]) -> None:
    parsed = parse_junit("", rA_run[1])
    assert parsed["tests.test_suite.test_pass"] is S.PASSED
    assert parsed["tests.test_suite.test_fail"] is S.FAILED
    assert parsed["tests.test_suite.test_error"] is S.ERROR
    assert parsed["tests.test_suite.test_pass_then_teardown_error"] is S.ERROR
    assert parsed["tests.test_suite.test_skip"] is S.SKIPPED
    assert parsed["tests.test_suite.test_xfail"] is S.XFAIL
    assert parsed["tests.test_suite.TestGroup.test_method_fails"] is S.FAILED
    assert parse_junit("", None) == {} and parse_junit("", "<not xml") == {}


def test_r2e_names(rA_run: tuple[str, str]) -> None:
    parsed = parse_r2e(rA_run[0])
    assert parsed["TestGroup.test_method"] is S.PASSED
    assert parsed["test_fail"] is S.FAILED


def test_registry() -> None:
    assert get_parser("pytest") is parse_pytest and get_parser("unittest") is parse_unittest
    with pytest.raises(KeyError, match="unknown log parser 'nose'"):
        get_parser("nose")


def test_every_swebench_python_parser_name_resolves() -> None:
    """SWE-bench's names (PARSER_REGISTRY's Python part) read with a farm format and its id rule."""
    rules = {
        "parse_log_pytest": IdRule.CUT, "parse_log_astroid": IdRule.CUT, "parse_log_flask": IdRule.CUT,
        "parse_log_marshmallow": IdRule.CUT, "parse_log_pvlib": IdRule.CUT, "parse_log_pyvista": IdRule.CUT,
        "parse_log_sqlfluff": IdRule.CUT, "parse_log_xarray": IdRule.CUT, "parse_log_pytest_options": IdRule.OPTIONS,
        "parse_log_pydicom": IdRule.OPTIONS, "parse_log_requests": IdRule.OPTIONS, "parse_log_pylint": IdRule.OPTIONS,
        "parse_log_pytest_v2": IdRule.FULL, "parse_log_astropy": IdRule.FULL, "parse_log_scikit": IdRule.FULL,
        "parse_log_sphinx": IdRule.FULL, "parse_log_matplotlib": IdRule.MATPLOTLIB,
        "parse_log_seaborn": IdRule.SEABORN, "parse_log_django": IdRule.EXACT, "parse_log_sympy": IdRule.EXACT,
    }  # fmt: skip
    for name, rule in rules.items():
        fmt = log_format(name)
        assert fmt.ids is rule, name
        assert fmt.pytest == (name not in ("parse_log_django", "parse_log_sympy")), name
    with pytest.raises(KeyError, match="SWE-bench's for Go test runners"):
        log_format("parse_log_gotest")
    with pytest.raises(KeyError, match="did you mean 'parse_log_sqlfluff'"):
        log_format("parse_log_sqlfuff")


def test_listed_ids_meet_exact_ids_swebench_style():
    """Exact node ids (the probe's, or parse_pytest's) resolve the ids SWE-bench lists."""
    statuses = {
        "t.py::test_a[x y]": S.PASSED, "t.py::test_a[x z]": S.PASSED,  # both listed as "t.py::test_a[x"
        "t.py::test_b[p q]": S.PASSED, "t.py::test_b[p r]": S.FAILED,  # the failure is printed last: it wins
        "t.py::test_c[k l]": S.PASSED, "t.py::test_c[k m]": S.SKIPPED,  # skips are printed without an id
        "t.py::test_d[/tmp/x/f.dcm]": S.PASSED, "t.py::test_e[a - b]": S.FAILED,
        "t.py::test_f[\\n    x = 1]": S.PASSED, "t.py::test_g": S.XFAIL,
    }  # fmt: skip
    cut = TestIds(statuses, IdRule.CUT)
    assert cut.status_of("t.py::test_a[x y]", "MISSING") == "PASSED"  # exact first
    assert cut.status_of("t.py::test_a[x", "MISSING") == "PASSED"
    assert cut.members(["t.py::test_a[x"]) == ["t.py::test_a[x y]", "t.py::test_a[x z]"]
    assert cut.status_of("t.py::test_b[p", "MISSING") == "FAILED"
    assert cut.status_of("t.py::test_c[k", "MISSING") == "PASSED"
    assert cut.status_of("t.py::test_e[a", "MISSING") == "FAILED"
    assert cut.status_of("t.py::test_f[\\n", "MISSING") == "PASSED"  # pytest escapes a newline in an id as \\n
    assert cut.status_of("t.py::test_h", "MISSING") == "MISSING"
    assert cut.status_of("t.py::test_d[/f.dcm]", "MISSING") == "MISSING"
    assert TestIds(statuses, IdRule.OPTIONS).status_of("t.py::test_d[/f.dcm]", "MISSING") == "PASSED"
    full = TestIds(statuses, IdRule.FULL)
    assert full.status_of("t.py::test_a[x", "MISSING") == "PASSED"  # cut by an older parser: prefix, agreeing
    assert full.status_of("t.py::test_b[p", "MISSING") == "MISSING"  # prefix, disagreeing: SWE-bench gives up
    assert full.status_of("t.py::test_e[a", "MISSING") == "FAILED"  # v2 cuts a FAILED line at its first " - "
    assert full.status_of("t.py::test_g - reason", "MISSING") == "XFAIL"  # v2 keeps an xfail's reason
    seaborn = TestIds({"t.py::test_x[a b]": S.XFAIL, "t.py::test_y[a b]": S.PASSED}, IdRule.SEABORN)
    assert seaborn.status_of("t.py::test_x[a", "MISSING") == "MISSING"  # seaborn's parser reads no XFAIL line
    assert seaborn.status_of("t.py::test_y[a", "MISSING") == "PASSED"
    mpl = TestIds({"t.py::test_m[MouseButton.LEFT-a b]": S.PASSED}, IdRule.MATPLOTLIB)
    assert mpl.status_of("t.py::test_m[1-a", "MISSING") == "PASSED"


def test_a_listed_id_the_run_did_not_report_gets_the_closest_it_did():
    """A FAIL_TO_PASS id that matches nothing (MISSING): the reported ids most like it, and
    only those (the other tests of the same file share its path)."""
    statuses = {"tests/test_lru.py::test_get_refreshes": S.FAILED, "tests/test_lru.py::test_update_refreshes": S.PASSED,
                "tests/test_lru.py::test_put_get": S.PASSED, "t.py::test_x[1]": S.PASSED, "t.py::test_x[2]": S.PASSED}  # fmt: skip
    ids = TestIds(statuses, IdRule.CUT)
    assert ids.status_of("tests/test_lru.py::test_get_refresh", "MISSING") == "MISSING"
    assert ids.closest("tests/test_lru.py::test_get_refresh") == ["tests/test_lru.py::test_get_refreshes"]
    assert ids.closest("tests/test_lru.py::TestLRU::test_get_refreshes") == ["tests/test_lru.py::test_get_refreshes"]
    assert ids.closest("t.py::test_x[3]") == ["t.py::test_x[1]", "t.py::test_x[2]"]  # equally close: both
    assert ids.closest("other/test_nothing_alike.py::test_q") == []
