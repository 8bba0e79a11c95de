"""Real SWE-bench-format tasks built from packages on the registry (tests, benchmarks).

A project's sdist (fetched from PyPI with pip) is unpacked into a git repository: the
release as the first commit, then a small bug as the task's base commit. The row is in the
current SWE-bench format (FAIL_TO_PASS / PASS_TO_PASS as JSON strings, ``version``,
``environment_setup_commit``, ``log_parser: parse_log_<name>``, no test command), the
repository is a bare mirror named as farm looks it up (``<owner>__<name>.git``).

- ``INFLECTION`` (``inflection`` 0.5.1, repo ``pypi/inflection``): a bug in ``dasherize``;
  a recipe file supplies what a local sandbox needs for version ``0.5``: a venv made with
  uv (or pip) holding pytest and ``extra_deps`` (real wheels: numpy/pandas/scipy make the
  environment as heavy as a scientific repository's).
- ``REQUESTS`` (``requests`` 2.31.0 as repo ``psf/requests``, version ``2.31``): a bug in
  ``CaseInsensitiveDict.__eq__`` and a test patch adding the test that catches it; no recipe
  file: farm's recipe book has SWE-bench's spec for psf/requests 2.31.
- ``DJANGO`` (``Django`` 4.2.11 as ``django/django`` version ``4.2``; ``DJANGO_30``, ``DJANGO_32``
  for 3.0 and 3.2) and ``SCIKIT_LEARN`` (1.3.2 as version ``1.3``): the book's own recipes on
  repositories too large to mirror here (``scripts/validate_book.py --sdist``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SdistProject:
    package: str
    version: str  # the release on PyPI
    repo: str  # owner/name the row names (and its mirror)
    row_version: str  # the row's SWE-bench `version`
    bug_file: str
    bug: tuple[str, str]  # (the release's text, the buggy text)
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    statement: str
    log_parser: str = "parse_log_pytest"
    new_test: tuple[str, str, str] | None = None  # (file, text, text inserted after it): the row's test patch
    drop: tuple[str, ...] = field(default=())  # sdist-only paths the repository does not hold


INFLECTION = SdistProject(
    package="inflection", version="0.5.1", repo="pypi/inflection", row_version="0.5",
    bug_file="inflection/__init__.py",
    bug=("return word.replace('_', '-')\n", "return word.replace('_', '-', 1)\n"),
    fail_to_pass=["test_inflection.py::test_dasherize[person_street_address-person-street-address]"],
    pass_to_pass=[
        "test_inflection.py::test_dasherize[street-street]",
        "test_inflection.py::test_dasherize[street_address-street-address]",
        "test_inflection.py::test_underscore[Product-product]",
        "test_inflection.py::test_titleize[active_record-Active Record]",
    ],
    statement="`inflection.dasherize` only replaces the first underscore: `dasherize('person_street_address')` "
    "returns 'person-street_address' instead of 'person-street-address'. Every underscore should become a dash.",
)  # fmt: skip

_STRUCTURES = "tests/test_structures.py"
REQUESTS = SdistProject(
    package="requests", version="2.31.0", repo="psf/requests", row_version="2.31",
    bug_file="requests/structures.py",
    bug=("return dict(self.lower_items()) == dict(other.lower_items())\n",
         "return dict(self.items()) == dict(other.items())\n"),
    fail_to_pass=[f"{_STRUCTURES}::TestCaseInsensitiveDict::test_instance_equality[other0-True]",
                  f"{_STRUCTURES}::TestCaseInsensitiveDict::test_equality_ignores_case"],
    pass_to_pass=[f"{_STRUCTURES}::TestCaseInsensitiveDict::test_instance_equality[other1-False]",
                  f"{_STRUCTURES}::TestCaseInsensitiveDict::test_instance_equality[None-False]",
                  f"{_STRUCTURES}::TestCaseInsensitiveDict::test_copy",
                  f"{_STRUCTURES}::TestCaseInsensitiveDict::test_getitem[aCcEpT]",
                  f"{_STRUCTURES}::TestLookupDict::test_getitem[bad_gateway-502]"],
    statement="`CaseInsensitiveDict` equality is case-sensitive: `CaseInsensitiveDict({'Accept': 'x'}) == "
    "{'ACCEPT': 'x'}` is False. Two mappings whose keys differ only in case should compare equal.",
    log_parser="parse_log_requests",
    new_test=(_STRUCTURES, "        assert (self.case_insensitive_dict == other) is result\n",
              "\n    def test_equality_ignores_case(self):\n"
              "        assert CaseInsensitiveDict({\"ACCEPT\": \"application/json\"}) == self.case_insensitive_dict\n"),
    drop=("requests.egg-info",),
)  # fmt: skip

# Django 4.2.11 as django/django version 4.2 (SWE-bench's spec: Python 3.9, tests/requirements/py3.txt,
# runtests.py with the row's test labels): the repository is too large for a mirror here, its
# sdist carries the test suite. A bug in capfirst and the test that catches it.
_TEXT = "tests/utils_tests/test_text.py"
DJANGO = SdistProject(
    package="Django", version="4.2.11", repo="django/django", row_version="4.2",
    bug_file="django/utils/text.py",
    bug=("    return x[0].upper() + x[1:]\n", "    return x[0].upper() + x[1:].lower()\n"),
    fail_to_pass=["test_capfirst (utils_tests.test_text.TestUtilsText)"],
    pass_to_pass=["test_truncate_chars (utils_tests.test_text.TestUtilsText)",
                  "test_wrap (utils_tests.test_text.TestUtilsText)",
                  "test_slugify (utils_tests.test_text.TestUtilsText)"],
    statement="`django.utils.text.capfirst` lowercases the rest of the string: `capfirst('hello World')` returns "
    "'Hello world'. Only the first letter should change.",
    log_parser="parse_log_django",
    new_test=(_TEXT, "class TestUtilsText(SimpleTestCase):\n",
              "    def test_capfirst(self):\n        self.assertEqual(text.capfirst('hello World'), 'Hello World')\n\n"),
    drop=("Django.egg-info",),
)  # fmt: skip


def _django_3(version: str, row_version: str) -> SdistProject:
    """Django 3.0/3.2 (SWE-bench's spec: Python 3.6, tests/requirements/py3.txt, runtests.py): capfirst's
    3.x body, the same bug and test as DJANGO."""
    return SdistProject(
        package="Django", version=version, repo="django/django", row_version=row_version,
        bug_file="django/utils/text.py",
        bug=("    return x and str(x)[0].upper() + str(x)[1:]\n", "    return x and str(x)[0].upper() + str(x)[1:].lower()\n"),
        fail_to_pass=DJANGO.fail_to_pass,
        pass_to_pass=["test_get_text_list (utils_tests.test_text.TestUtilsText)",
                      "test_truncate_chars (utils_tests.test_text.TestUtilsText)",
                      "test_wrap (utils_tests.test_text.TestUtilsText)",
                      "test_slugify (utils_tests.test_text.TestUtilsText)"],
        statement=DJANGO.statement, log_parser="parse_log_django", new_test=DJANGO.new_test, drop=("Django.egg-info",),
    )  # fmt: skip


DJANGO_30 = _django_3("3.0.14", "3.0")
DJANGO_32 = _django_3("3.2.25", "3.2")

# scikit-learn 1.3.2 as scikit-learn/scikit-learn version 1.3 (SWE-bench's spec: Python 3.9, pinned numpy/
# scipy/cython, the extensions built in place by pip --no-build-isolation): a bug in gen_batches' last
# batch and the test that catches it. Its sdist (1.3) is fetched from the index's link: pip download
# would build its metadata, which needs its build dependencies.
_SK_UTILS = "sklearn/utils/tests/test_utils.py"
SCIKIT_LEARN = SdistProject(
    package="scikit-learn", version="1.3.2", repo="scikit-learn/scikit-learn", row_version="1.3",
    bug_file="sklearn/utils/__init__.py",
    bug=("        yield slice(start, n)\n", "        yield slice(start, n - 1)\n"),
    fail_to_pass=[f"{_SK_UTILS}::test_gen_batches_last"],
    pass_to_pass=[f"{_SK_UTILS}::test_make_rng", f"{_SK_UTILS}::test_safe_mask", f"{_SK_UTILS}::test_column_or_1d",
                  f"{_SK_UTILS}::test_resample"],
    statement="`sklearn.utils.gen_batches` drops the last sample: `list(gen_batches(7, 3))` ends with "
    "`slice(6, 6)` instead of `slice(6, 7)`. The last batch should reach `n`.",
    log_parser="parse_log_scikit",
    new_test=(_SK_UTILS, "    mask = safe_mask(X_csr, mask)\n    assert X_csr[mask].shape[0] == 3\n",
              "\n\ndef test_gen_batches_last():\n    from sklearn.utils import gen_batches\n\n"
              "    assert list(gen_batches(7, 3)) == [slice(0, 3), slice(3, 6), slice(6, 7)]\n"),
    drop=("scikit_learn.egg-info",),
)  # fmt: skip

# The inflection task's facts under their historical names (users of this module import them).
PACKAGE, VERSION, REPO = INFLECTION.package, INFLECTION.version, INFLECTION.repo
BUG, FAIL_TO_PASS, PASS_TO_PASS = INFLECTION.bug, INFLECTION.fail_to_pass, INFLECTION.pass_to_pass
STATEMENT = INFLECTION.statement


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    base = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}  # fmt: skip
    res = subprocess.run(["git", *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, check=True)
    return res.stdout.strip()


def download_sdist(cache: Path, package: str, version: str) -> Path:
    """``package==version``'s sdist from the package registry (pip download), cached."""
    cache.mkdir(parents=True, exist_ok=True)
    name = f"{package}-{version}.tar.gz"
    if not (cache / name).is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(cache),
             f"{package}=={version}"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cache / name


def fetch_sdist(cache: Path, project: SdistProject = INFLECTION) -> Path:
    """The project's sdist (``download_sdist``)."""
    return download_sdist(cache, project.package, project.version)


def build_mirror(root: Path, sdist: Path, project: SdistProject = INFLECTION) -> tuple[Path, str, str, str]:
    """(mirrors dir, base commit, gold patch, test patch): the release, then the bug on top;
    the test patch adds ``project.new_test`` (empty without one)."""
    work = root / "work"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    os.rename(root / "unpacked" / f"{project.package}-{project.version}", work)
    for path in project.drop:
        subprocess.run(["rm", "-rf", str(work / path)], check=True)
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"{project.package} {project.version} from its sdist")
    mod = work / project.bug_file
    text = mod.read_text()
    assert project.bug[0] in text, "the sdist changed: the bug cannot be introduced"
    mod.write_text(text.replace(project.bug[0], project.bug[1], 1))
    _git(work, "commit", "-q", "-am", "a bug")
    base = _git(work, "rev-parse", "HEAD")
    gold = _git(work, "diff", "HEAD", "HEAD~1", "--", project.bug_file) + "\n"
    test_patch = ""
    if project.new_test:
        path, anchor, added = project.new_test
        test_file = work / path
        tests = test_file.read_text()
        assert anchor in tests, "the sdist changed: the test cannot be added"
        test_file.write_text(tests.replace(anchor, anchor + added, 1))
        test_patch = _git(work, "diff", "--", path) + "\n"
        _git(work, "checkout", "-q", "--", path)
    mirrors = root / "mirrors"
    mirrors.mkdir(exist_ok=True)
    mirror = mirrors / (project.repo.replace("/", "__") + ".git")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror)], check=True)
    return mirrors, base, gold, test_patch


def swebench_row(base: str, gold: str, instance: str = "pypi__inflection-1", *, project: SdistProject = INFLECTION,
                 test_patch: str = "") -> dict:  # fmt: skip
    return {
        "instance_id": instance,
        "repo": project.repo,
        "base_commit": base,
        "environment_setup_commit": base,
        "version": project.row_version,
        "problem_statement": project.statement,
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(project.fail_to_pass),
        "PASS_TO_PASS": json.dumps(project.pass_to_pass),
        "log_parser": project.log_parser,
        "created_at": "2020-01-01T00:00:00Z",
    }


def recipe(installer: str = "uv", extra_deps: list[str] | None = None) -> dict:
    """The recipe file's content for repo ``pypi/inflection`` version 0.5."""
    deps = " ".join(["pytest", *(extra_deps or [])])
    if installer == "uv":
        setup = ["uv venv -q .venv", f"uv pip install -q --python .venv/bin/python {deps}"]
    else:
        setup = ["python -m venv .venv", f".venv/bin/python -m pip install -q --disable-pip-version-check {deps}"]
    return {
        REPO: {
            "0.5": {
                "setup": ["echo .venv/ >> .git/info/exclude", *setup],
                "test_command": ".venv/bin/python -m pytest -rA -p no:cacheprovider {test_files}",
                "test_files": ["test_inflection.py"],
            }
        }
    }


def make_task_set(root: Path, *, installer: str = "uv", extra_deps: list[str] | None = None,
                  sdist_cache: Path | None = None) -> dict[str, Path]:  # fmt: skip
    """Write ``tasks.jsonl`` (one SWE-bench row), ``recipes.yaml`` and the mirror under
    ``root``; returns their paths (keys: tasks, recipes, mirrors)."""
    root.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist(sdist_cache or default_sdist_cache())
    mirrors, base, gold, _ = build_mirror(root, sdist)
    tasks = root / "tasks.jsonl"
    tasks.write_text(json.dumps(swebench_row(base, gold)) + "\n")
    recipes = root / "recipes.yaml"
    recipes.write_text(yaml.safe_dump(recipe(installer, extra_deps), sort_keys=False))
    return {"tasks": tasks, "recipes": recipes, "mirrors": mirrors}


def make_book_task(root: Path, project: SdistProject = REQUESTS, *, sdist_cache: Path | None = None) -> dict:
    """One row of ``project`` for farm's recipe book (no recipe file): ``tasks.jsonl`` and the
    mirror under ``root``; returns {tasks, mirrors, row}."""
    root.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist(sdist_cache or default_sdist_cache(), project)
    mirrors, base, gold, test_patch = build_mirror(root, sdist, project)
    instance = f"{project.repo.replace('/', '__')}-1"
    row = swebench_row(base, gold, instance, project=project, test_patch=test_patch)
    tasks = root / "tasks.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    return {"tasks": tasks, "mirrors": mirrors, "row": row}


def default_sdist_cache() -> Path:
    return Path(os.path.expanduser("~/.cache/farm/testing/sdists"))
