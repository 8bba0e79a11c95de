"""A real SWE-bench-format task built from a package on the registry (tests, benchmarks).

``inflection`` 0.5.1's sdist (fetched from PyPI with pip) is unpacked into a git
repository: the release as the first commit, then a small bug in ``dasherize`` as the
task's base commit. The row is in the current SWE-bench format (FAIL_TO_PASS /
PASS_TO_PASS as JSON strings, ``version``, ``environment_setup_commit``,
``log_parser: parse_log_pytest``, no test command), the repository is a bare mirror
named as farm looks it up (``<owner>__<name>.git``), and a recipe file supplies what
a local sandbox needs for repo ``pypi/inflection`` version ``0.5``: a venv made with
uv (or pip) holding pytest and ``extra_deps`` (real wheels: numpy/pandas/scipy make
the environment as heavy as a scientific repository's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

PACKAGE, VERSION = "inflection", "0.5.1"
REPO = "pypi/inflection"
BUG = ("return word.replace('_', '-')\n", "return word.replace('_', '-', 1)\n")
FAIL_TO_PASS = ["test_inflection.py::test_dasherize[person_street_address-person-street-address]"]
PASS_TO_PASS = [
    "test_inflection.py::test_dasherize[street-street]",
    "test_inflection.py::test_dasherize[street_address-street-address]",
    "test_inflection.py::test_underscore[Product-product]",
    "test_inflection.py::test_titleize[active_record-Active Record]",
]
STATEMENT = (
    "`inflection.dasherize` only replaces the first underscore: `dasherize('person_street_address')` "
    "returns 'person-street_address' instead of 'person-street-address'. Every underscore should become a dash."
)


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    base = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_AUTHOR_DATE": "2020-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2020-01-01T00:00:00Z"}  # fmt: skip
    res = subprocess.run(["git", *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, check=True)
    return res.stdout.strip()


def fetch_sdist(cache: Path) -> Path:
    """The sdist from the package registry (pip download), cached."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"{PACKAGE}-{VERSION}.tar.gz"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(cache),
             f"{PACKAGE}=={VERSION}"],
            check=True, capture_output=True,
        )  # fmt: skip
        found = sorted(cache.glob(f"{PACKAGE}-{VERSION}.tar.gz"))
    return found[0]


def build_mirror(root: Path, sdist: Path) -> tuple[Path, str, str]:
    """(mirror dir, base commit, gold patch): the release, then the bug on top."""
    work = root / "work"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    src = root / "unpacked" / f"{PACKAGE}-{VERSION}"
    os.rename(src, work)
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"{PACKAGE} {VERSION} from its sdist")
    mod = work / PACKAGE / "__init__.py"
    text = mod.read_text()
    assert BUG[0] in text, "the sdist changed: the bug cannot be introduced"
    mod.write_text(text.replace(BUG[0], BUG[1], 1))
    _git(work, "commit", "-q", "-am", "dasherize: only the first underscore")
    base = _git(work, "rev-parse", "HEAD")
    gold = _git(work, "diff", "HEAD", "HEAD~1", "--", f"{PACKAGE}/__init__.py") + "\n"
    mirrors = root / "mirrors"
    mirrors.mkdir(exist_ok=True)
    mirror = mirrors / "pypi__inflection.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mirror)], check=True)
    return mirrors, base, gold


def swebench_row(base: str, gold: str, instance: str = "pypi__inflection-1") -> dict:
    return {
        "instance_id": instance,
        "repo": REPO,
        "base_commit": base,
        "environment_setup_commit": base,
        "version": "0.5",
        "problem_statement": STATEMENT,
        "patch": gold,
        "test_patch": "",
        "FAIL_TO_PASS": json.dumps(FAIL_TO_PASS),
        "PASS_TO_PASS": json.dumps(PASS_TO_PASS),
        "log_parser": "parse_log_pytest",
        "image_name": "swebench/sweb.eval.x86_64.pypi_1776_inflection-1:latest",
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
    sdist = fetch_sdist(sdist_cache or Path(os.path.expanduser("~/.cache/farm/testing/sdists")))
    mirrors, base, gold = build_mirror(root, sdist)
    tasks = root / "tasks.jsonl"
    tasks.write_text(json.dumps(swebench_row(base, gold)) + "\n")
    recipes = root / "recipes.yaml"
    recipes.write_text(yaml.safe_dump(recipe(installer, extra_deps), sort_keys=False))
    return {"tasks": tasks, "recipes": recipes, "mirrors": mirrors}
