"""Django's and SymPy's formats on output of their REAL runners, from their sdists on PyPI.

Django's sdist carries ``tests/runtests.py``: run as SWE-bench runs it (``--verbosity 2
--settings=test_sqlite --parallel 1``) on one of Django's own test classes and a test
module of ours with every outcome. SymPy's sdists carry the runner (``sympy.testing.runtests``)
but not the ``bin/test`` script: we call ``sympy.test(..., verbose=True)`` with
``SYMPY_USE_CACHE=no``, which is all ``bin/test -C --verbose`` does. farm's parse must equal
SWE-bench's own parser (the ``swebench`` package) on the same output, and hold the ids
SWE-bench lists. The sdists are downloaded once into pytest's cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from swebench.harness import log_parsers as swebench_parsers  # SWE-bench's own parsers: a dev dependency

from farm.grading.parsers import TestIds, TestStatus, log_format, parse_django, parse_sympy

S = TestStatus

DJANGO_CASES = '''import sys
import unittest

from django.test import SimpleTestCase


class Cases(SimpleTestCase):
    def test_pass(self):
        pass

    def test_docstring(self):
        """First line of the docstring.

        More text.
        """

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    @unittest.skip("not today")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertEqual(1, 2)

    def test_prints(self):
        sys.stderr.write("noise on stderr\\n")
'''

SYMPY_CASES = '''from sympy import Symbol
from sympy.testing.pytest import SKIP, XFAIL


def test_pass():
    assert Symbol("x") == Symbol("x")


def test_fail():
    assert Symbol("x") == Symbol("y")


def test_error():
    raise RuntimeError("boom")


@SKIP("not today")
def test_skip():
    pass


@XFAIL
def test_xfail():
    assert False


def test_last():
    pass
'''


def _fetch(cache: Path, requirement: str, *, sdist: bool) -> Path:
    """One distribution file of ``requirement`` from PyPI (cached)."""
    dest = cache / requirement.replace("==", "-")
    found = sorted(dest.glob("*")) if dest.is_dir() else []
    if not found:
        fmt = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *fmt, requirement, "-d", str(dest)],
            check=True, timeout=600,
        )  # fmt: skip
        found = sorted(dest.glob("*"))
    return found[0]


def _unpacked(cache: Path, requirement: str, *, sdist: bool) -> Path:
    archive = _fetch(cache, requirement, sdist=sdist)
    target = cache / "unpacked" / archive.name
    if not target.is_dir():
        tmp = target.with_suffix(".tmp")
        if sdist:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
        else:
            with zipfile.ZipFile(archive) as whl:
                whl.extractall(tmp)
        tmp.rename(target)
    return target


@pytest.fixture(scope="module")
def sdist_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    return Path(cache.mkdir("farm-runner-sdists")) if cache is not None else tmp_path_factory.mktemp("sdists")


def _run(cmd: list[str], cwd: Path, pythonpath: list[Path], **env: str) -> str:
    full_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": ":".join(map(str, pythonpath)), **env}
    res = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)
    return res.stdout + "\n" + res.stderr


@pytest.mark.slow
def test_django_runtests_output(sdist_cache: Path) -> None:
    root = next(_unpacked(sdist_cache, "django==4.2.30", sdist=True).glob("[Dd]jango-*"))
    deps = [_unpacked(sdist_cache, r, sdist=False) for r in ("asgiref==3.13.0", "sqlparse==0.6.1")]
    (root / "tests" / "farm_cases").mkdir(exist_ok=True)
    (root / "tests" / "farm_cases" / "__init__.py").write_text("")
    (root / "tests" / "farm_cases" / "tests.py").write_text(DJANGO_CASES)
    out = _run(
        [sys.executable, "tests/runtests.py", "--verbosity", "2", "--settings=test_sqlite", "--parallel", "1",
         "farm_cases", "basic.tests.ModelInstanceCreationTests"],
        root, [root, *deps],
    )  # fmt: skip
    assert "Ran 21 tests" in out, out[-3000:]
    parsed = parse_django(out)
    assert parsed == swebench_parsers.parse_log_django(out, None)  # ids and statuses exactly as SWE-bench's
    case = "farm_cases.tests.Cases"
    assert parsed[f"test_pass ({case}.test_pass)"] is S.PASSED
    assert parsed["First line of the docstring."] is S.PASSED  # unittest prints a docstring's first line
    assert parsed[f"test_fail ({case}.test_fail)"] is S.FAILED and parsed["test_fail"] is S.FAILED
    assert parsed[f"test_error ({case}.test_error)"] is S.ERROR and parsed["test_error"] is S.ERROR
    assert parsed[f"test_skip ({case}.test_skip)"] is S.SKIPPED
    assert parsed[f"test_prints ({case}.test_prints)"] is S.PASSED  # "ok" on the line after its noise
    assert not any("test_xfail" in k for k in parsed)  # SWE-bench does not read expected failures
    assert parsed["You can initialize a model instance using positional arguments,"] is S.PASSED  # Django's own
    ids = TestIds(parsed, log_format("parse_log_django").ids)
    assert ids.status_of("First line of the docstring.", "MISSING") == "PASSED"


@pytest.mark.slow
def test_sympy_bin_test_output(sdist_cache: Path) -> None:
    root = next(_unpacked(sdist_cache, "sympy==1.12.1", sdist=True).glob("sympy-*"))
    mpmath = _unpacked(sdist_cache, "mpmath==1.4.1", sdist=False)
    (root / "sympy" / "core" / "tests" / "test_farm_cases.py").write_text(SYMPY_CASES)
    files = ["sympy/core/tests/test_farm_cases.py", "sympy/core/tests/test_truediv.py"]
    out = _run(
        [sys.executable, "-c", "import sys, sympy; sys.exit(not sympy.test(*sys.argv[1:], verbose=True))", *files],
        root, [root, mpmath], SYMPY_USE_CACHE="no",
    )  # fmt: skip
    assert "tests finished:" in out and "cache:              no" in out, out[-3000:]
    parsed = parse_sympy(out)
    assert parsed == swebench_parsers.parse_log_sympy(out, None)  # ids and statuses exactly as SWE-bench's
    assert parsed["test_pass"] is S.PASSED and parsed["test_truediv"] is S.PASSED
    assert parsed["test_fail"] is S.FAILED and parsed["test_error"] is S.ERROR
    assert parsed["sympy/core/tests/test_farm_cases.py:test_fail"] is S.FAILED  # the failure section's header
    assert not {"test_skip", "test_xfail"} & parsed.keys()
    assert "test_last" not in parsed  # printed with the file's [OK]/[FAIL] on its line: SWE-bench skips it
