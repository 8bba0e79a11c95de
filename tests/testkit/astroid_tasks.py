"""Real bugs of a real repository, as SWE-bench rows, for the tests that guard grading.

SWE-bench Lite's dev rows ``pylint-dev__astroid-1196`` and ``pylint-dev__astroid-1333``
are graded through unittest.TestCase tests (two of them ``@staticmethod`` methods of a
TestCase, one using ``addCleanup`` in a class whose neighbours take a base class from
another module). Their real fixes are still in astroid today, with their tests, and
astroid's sdist ships its tests: so astroid 3.3.8's sdist (fetched from PyPI with pip)
is unpacked into a git repository (the release as the first commit), and each fix is
taken out again on its own branch: that commit is the row's base, and the real fix,
put back, is its gold patch. The rows are in SWE-bench's current format; the recipe
makes a venv with uv holding only pytest (astroid 3 needs nothing else on 3.11+), and
the tests import astroid from the checkout (``python -m pytest`` puts it on the path).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from testkit.sdist_task import _git, default_sdist_cache, download_sdist

PACKAGE, VERSION = "astroid", "3.3.8"
REPO = "pypi/astroid"


@dataclass(frozen=True)
class RealFix:
    instance: str
    path: str
    fixed: str  # the fix as the release has it
    buggy: str  # the code before the fix
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    statement: str


_P3 = "tests/test_python3.py::Python3TC::"
_MP = "tests/test_modutils.py::"
FIXES = (
    RealFix(
        instance="pypi__astroid-1196",
        path="astroid/nodes/node_classes.py",
        fixed="""            if isinstance(key, DictUnpack):
                inferred_value = util.safe_infer(value, context)
                if not isinstance(inferred_value, Dict):
                    continue

                try:
                    return inferred_value.getitem(index, context)
""",
        buggy="""            if isinstance(key, DictUnpack):
                try:
                    return value.getitem(index, context)
""",
        fail_to_pass=(f"{_P3}test_unpacking_in_dict_getitem_uninferable", f"{_P3}test_unpacking_in_dict_getitem_with_ref"),
        pass_to_pass=tuple(f"{_P3}{n}" for n in (
            "test_annotation_as_string", "test_as_string", "test_format_string", "test_metaclass_ancestors",
            "test_nested_unpacking_in_dicts", "test_starred_notation", "test_unpacking_in_dict_getitem",
            "test_unpacking_in_dicts", "test_yield_from", "test_yield_from_is_generator")),  # fmt: skip
        statement="`Dict.getitem()` raises AttributeError ('Name' object has no attribute 'getitem') on a dict "
        "that unpacks anything but a dict literal (`{**a, 2: 3}`): infer the unpacked value, and raise "
        "AstroidIndexError when it cannot be inferred.",
    ),
    RealFix(
        instance="pypi__astroid-1333",
        path="astroid/modutils.py",
        fixed="""    paths_to_check = sys.path.copy()
    if path:
        paths_to_check += path
    for pathname in itertools.chain(
        paths_to_check, map(_cache_normalize_path, paths_to_check)
    ):
""",
        buggy="""    for pathname in itertools.chain(
        path or [], map(_cache_normalize_path, sys.path), sys.path
    ):
""",
        fail_to_pass=(f"{_MP}ModPathFromFileTest::test_load_packages_without_init",),
        pass_to_pass=(
            f"{_MP}ModPathFromFileTest::test_known_values_modpath_from_file_1",
            f"{_MP}ModPathFromFileTest::test_raise_modpath_from_file_exception",
            f"{_MP}ModPathFromFileTest::test_import_symlink_both_outside_of_path",
            f"{_MP}LoadModuleFromPathTest::test_do_not_load_twice",
            f"{_MP}GetModulePartTest::test_known_values_get_module_part_1",
        ),
        statement="`modutils.modpath_from_file` cannot find a package without `__init__.py` given on the "
        "extra path (`modpath_from_file('src/package', ['.'])`): check the extra path as well as sys.path.",
    ),
)


def fetch_sdist(cache: Path) -> Path:
    """astroid's sdist from the package registry (pip download), cached."""
    return download_sdist(cache, PACKAGE, VERSION)


def build_mirror(root: Path, sdist: Path) -> tuple[Path, dict[str, tuple[str, str]]]:
    """(mirrors dir, instance -> (base commit, gold patch)): the release, then each fix
    taken out on its own branch."""
    work = root / "work"
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    os.rename(root / "unpacked" / f"{PACKAGE}-{VERSION}", work)
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-q", "-m", f"{PACKAGE} {VERSION} from its sdist")
    rows = {}
    for fix in FIXES:
        _git(work, "checkout", "-q", "-b", fix.instance, "main")
        target = work / fix.path
        text = target.read_text()
        assert fix.fixed in text, f"the sdist changed: {fix.instance} cannot be taken out"
        target.write_text(text.replace(fix.fixed, fix.buggy, 1))
        _git(work, "commit", "-q", "-am", f"before {fix.instance}")
        base = _git(work, "rev-parse", "HEAD")
        rows[fix.instance] = (base, _git(work, "diff", "HEAD", "main", "--", fix.path) + "\n")
    _git(work, "checkout", "-q", "main")
    mirrors = root / "mirrors"
    mirrors.mkdir(exist_ok=True)
    subprocess.run(["git", "clone", "-q", "--mirror", str(work), str(mirrors / "pypi__astroid.git")], check=True)
    return mirrors, rows


def swebench_row(fix: RealFix, base: str, gold: str, *, version: str = "3.3", test_patch: str = "") -> dict:
    return {
        "instance_id": fix.instance,
        "repo": REPO,
        "base_commit": base,
        "environment_setup_commit": base,
        "version": version,
        "problem_statement": fix.statement,
        "patch": gold,
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(list(fix.fail_to_pass)),
        "PASS_TO_PASS": json.dumps(list(fix.pass_to_pass)),
        "log_parser": "parse_log_pytest",
        "created_at": "2022-01-01T00:00:00Z",
    }


def recipe() -> dict:
    """Recipes for ``pypi/astroid``: version 3.3 (a venv with pytest), "3.3-xdist" (tests
    spread over two pytest-xdist workers) and "3.3-no-pytest" (a venv without pytest: an
    environment that cannot run its tests)."""

    def one(deps: str, options: str = "") -> dict:
        install = [f"uv pip install -q --python .venv/bin/python {deps}"] if deps else []
        return {
            "setup": ["echo .venv/ >> .git/info/exclude", "uv venv -q .venv", *install],
            "test_command": f".venv/bin/python -m pytest -rA -p no:cacheprovider {options}{{test_files}}",
        }

    return {REPO: {"3.3": one("pytest"), "3.3-xdist": one("pytest pytest-xdist", "-n 2 "), "3.3-no-pytest": one("")}}


# A conftest the test patch brings, importing a package the environment lacks (pytest's exit 4).
MISSING_PACKAGE_CONFTEST = (
    "diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n--- /dev/null\n"
    "+++ b/tests/conftest.py\n@@ -0,0 +1,2 @@\n+import numpy\n+\n"
)


def make_task_set(root: Path, *, sdist_cache: Path | None = None) -> dict[str, Path]:
    """Write ``tasks.jsonl``, ``recipes.yaml`` and the mirror under ``root``; returns their
    paths (keys: tasks, recipes, mirrors). The rows: each real fix, 1333 again with its
    tests run by pytest-xdist workers (``-xdist``), and two rows of 1196 whose environment
    cannot run its tests (``-no-pytest``: a venv without pytest; ``-conftest``: a conftest
    importing numpy, which the venv lacks)."""
    root.mkdir(parents=True, exist_ok=True)
    sdist = fetch_sdist(sdist_cache or default_sdist_cache())
    mirrors, built = build_mirror(root, sdist)
    rows = [swebench_row(fix, *built[fix.instance]) for fix in FIXES]
    first, second = FIXES
    rows.append({**swebench_row(second, *built[second.instance], version="3.3-xdist"),
                 "instance_id": f"{second.instance}-xdist"})  # fmt: skip
    rows.append({**swebench_row(first, *built[first.instance], version="3.3-no-pytest"),
                 "instance_id": f"{first.instance}-no-pytest"})  # fmt: skip
    rows.append({**swebench_row(first, *built[first.instance], test_patch=MISSING_PACKAGE_CONFTEST),
                 "instance_id": f"{first.instance}-conftest"})  # fmt: skip
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipes = root / "recipes.yaml"
    recipes.write_text(yaml.safe_dump(recipe(), sort_keys=False))
    return {"tasks": tasks, "recipes": recipes, "mirrors": mirrors}
