"""farm's recipe book (farm/tasks/recipe_book): it loads and is well-formed, a user's file
overrides it per repository-version, rows whose recipe needs what this machine lacks (or
whose version has none) are reported when they load, and a SWE-bench row of a repository
in the book goes from its file to a graded task with nothing but a mirror."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from farm.errors import TaskLoadError
from farm.grading.parsers import log_format
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from farm.tasks.recipes import BUILTIN, builtin_recipes, fill_test_command, load_book, recipe_sources
from farm.tasks.requirements import Requirement, check_met
from farm.tasks.venvs import conda_env_step, editable_step, prefix_step, requirements_step, submodule_step

# The repositories of SWE-bench's Lite / Verified / full test splits and of its dev split.
SWEBENCH_REPOS = {
    "astropy/astropy", "django/django", "pallets/flask", "matplotlib/matplotlib", "pylint-dev/pylint",
    "pytest-dev/pytest", "psf/requests", "scikit-learn/scikit-learn", "mwaskom/seaborn", "sphinx-doc/sphinx",
    "sympy/sympy", "pydata/xarray", "marshmallow-code/marshmallow", "pvlib/pvlib-python", "pydicom/pydicom",
    "pylint-dev/astroid", "sqlfluff/sqlfluff", "pyvista/pyvista",
}  # fmt: skip


def row(repo: str, version: str, **extra) -> dict:
    """A row in SWE-bench's current format (no setup, no test command, parser named the SWE-bench way)."""
    name = repo.replace("/", "__")
    test_patch = (
        "diff --git a/tests/foo/tests.py b/tests/foo/tests.py\n--- a/tests/foo/tests.py\n+++ b/tests/foo/tests.py\n"
        "@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
        "diff --git a/tests/foo/data.json b/tests/foo/data.json\n--- a/tests/foo/data.json\n+++ b/tests/foo/data.json\n"
        "@@ -1 +1 @@\n-{}\n+{\"a\": 1}\n"
    )  # fmt: skip
    out = {
        "instance_id": f"{name}-{version}", "repo": repo, "base_commit": "b" * 40, "environment_setup_commit": "c" * 40,
        "version": version, "problem_statement": "it is broken", "patch": "", "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/foo/tests.py::test_y"]), "PASS_TO_PASS": [],
    }  # fmt: skip  (no image named: a row naming one runs in it, tasks.images.prefer)
    out.update(extra)
    return out


def write(path: Path, *rows: dict) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_book_covers_swebench_and_every_entry_is_well_formed() -> None:
    book = builtin_recipes()
    assert SWEBENCH_REPOS <= set(book)
    assert {"3.0", "3.19", "2.18"} <= set(book["marshmallow-code/marshmallow"])
    assert {"0.4", "1.4", "2.2"} <= set(book["sqlfluff/sqlfluff"]) and "v5.3" in book["astropy/astropy"]
    entries = [(repo, v, r) for repo, versions in book.items() for v, r in versions.items()]
    assert len(entries) > 250
    for repo, version, recipe in entries:
        where = f"{repo}@{version}"
        assert re.fullmatch(r"3\.\d+", recipe.python or ""), where
        assert recipe.base_setup and recipe.base_setup[0].startswith("uv venv"), where
        assert recipe.setup and all(c.strip() for c in recipe.base_setup + recipe.setup), where
        assert ".venv/" in recipe.setup[0] and ".git/info/exclude" in recipe.setup[0], where  # kept out of diffs
        assert recipe.test_command and ". .venv/bin/activate && " in recipe.test_command, where
        assert ("{test_labels}" if repo == "django/django" else "{test_files}") in recipe.test_command, where
        assert recipe.env.get("UV_EXCLUDE_NEWER"), where
        if recipe.log_parser:
            log_format(recipe.log_parser)  # KeyError: a name the grader cannot read
        else:
            assert repo == "dbt-labs/dbt-core", where  # the harness names no parser for it
    assert book["django/django"]["4.0"].test_command.endswith("--parallel 1 {test_labels}")
    assert "bin/test -C --verbose {test_files}" in book["sympy/sympy"]["1.12"].test_command


def test_the_book_carries_what_the_real_dev_rows_needed() -> None:
    """What the SWE-bench Lite dev rows showed, run through `farm validate-tasks` (README,
    "Real SWE-bench rows"): pydicom 1.2 to 2.3's nose-style setup() methods need pytest
    below 8 (else 2 PASS_TO_PASS tests of pydicom-1139/1413 fail); astroid 2.12 to 2.14 pin
    setuptools~=62.6 (no PEP 660 editable hook): pip installs them, uv cannot."""
    book = builtin_recipes()
    pydicom = book["pydicom/pydicom"]
    for version, pinned in (("1.1", False), ("1.2", True), ("1.3", True), ("2.0", True), ("2.3", True), ("2.4", False)):
        assert any("'pytest<8'" in c for c in pydicom[version].base_setup) is pinned, version
    astroid = book["pylint-dev/astroid"]
    for version, with_pip in (("2.10", False), ("2.12", True), ("2.13", True), ("2.14", True), ("2.15", False)):
        assert (astroid[version].setup[-1] == ".venv/bin/python -m pip install -q -e .") is with_pip, version
    # astropy 0.1 to 1.3 (Python 3.6): MarkupSafe 1.0's sdist imports setuptools.Feature (gone in 46), so its
    # isolated build gets setuptools below 46; 3.0 on pins wheels of today's setuptools
    astropy = book["astropy/astropy"]
    for version, constrained in (("0.1", True), ("1.3", True), ("3.0", False), ("5.0", False)):
        steps = astropy[version].base_setup
        pins = next(c for c in steps if "pytest==" in c)
        assert ("--build-constraint .venv/build-constraints.txt" in pins) is constrained, version
        assert any("'setuptools>=40.8,<46" in c and "> .venv/build-constraints.txt" in c for c in steps) is constrained


def test_farms_own_steps_in_the_book_are_carried_out_and_checked(tmp_path: Path) -> None:
    """The book names farm's steps where they run (farm-requirements: SWE-bench's reading of a
    requirements file; farm-conda-env): a row gets the commands that carry them out, and the
    venv made a prefix last; a recipe naming a step wrongly is refused when it loads."""
    book = builtin_recipes()
    assert book["pylint-dev/pylint"]["2.15"].base_setup[1] == "farm-requirements requirements_test.txt"
    assert not [(repo, v) for repo, vs in book.items() for v, r in vs.items()
                if any("sed -E" in c and "requirements" in c for c in r.base_setup)]  # fmt: skip
    path = write(tmp_path / "rows.jsonl", row("pylint-dev/pylint", "2.15"))
    (task,) = load_tasks(path, check_requirements=False).tasks
    assert task.base_setup_commands[1] == requirements_step(["requirements_test.txt"])
    assert task.base_setup_commands[-1] == prefix_step()
    # astropy up to 3.2 builds with its astropy_helpers submodule: filled before the checkout's install
    old = write(tmp_path / "old.jsonl", row("astropy/astropy", "1.3"))
    (astropy,) = load_tasks(old, check_requirements=False).tasks
    fill = astropy.setup_commands.index(submodule_step("astropy_helpers", "astropy-helpers", "ah_bootstrap.py"))
    assert "pip install -q -e '.[test]'" in astropy.setup_commands[fill + 1]
    mine = tmp_path / "mine.yaml"
    for bad, why in (("farm-requirement x.txt", "unknown step 'farm-requirement'"),
                     ("farm-conda-env a.yml b.yml", "farm-conda-env takes one file"),
                     ("farm-requirements", "farm-requirements takes one or more paths"),
                     ("farm-httpbin 8080", "farm-httpbin takes no argument"),
                     ("farm-submodule astropy_helpers", "farm-submodule takes a path, a package and optionally a file")):  # fmt: skip
        mine.write_text(f"acme/tool:\n  '1.0': {{base_setup: ['{bad}']}}\n")
        with pytest.raises(TaskLoadError, match=why):
            load_tasks(path, recipes=str(mine))


def test_a_recipes_timeouts_fill_a_rows_defaults(tmp_path: Path) -> None:
    """astropy's install builds C extensions, over the default 10 minutes a setup command gets on
    a small machine: its recipes give setup an hour (a row with budgets of its own keeps them)."""
    path = write(tmp_path / "rows.jsonl", row("astropy/astropy", "5.1"), row("psf/requests", "2.31"))
    astropy, requests = load_tasks(path, check_requirements=False).tasks
    assert astropy.timeouts.setup_s == 3600 and astropy.timeouts.test_s == 900 and requests.timeouts.setup_s == 600


def test_requirement_entries_and_checks() -> None:
    req = Requirement.model_validate({"apt": "graphviz", "check": "command:dot"})
    assert req.check == ["command:dot"] and req.kind == "apt"
    for bad in ({"apt": "x", "conda": "y", "check": "never"}, {"check": "never"}, {"apt": "x", "check": "dot"},
                {"apt": "x", "check": []}):  # fmt: skip
        with pytest.raises(ValueError):
            Requirement.model_validate(bad)
    assert check_met("command:sh") and not check_met("command:farm-no-such-tool") and not check_met("never")
    assert check_met(f"file:{__file__}") and not check_met("file:/no/such/file")
    assert check_met("locale:C") and not check_met("locale:xx_NO.SUCH-8")
    assert check_met("library:c") and not check_met("library:farm-no-such-lib")


def test_a_row_gets_its_recipe_from_the_book_with_no_recipe_file(tmp_path: Path) -> None:
    rows = [row("django/django", "4.0"), row("psf/requests", "2.31", log_parser="parse_log_requests")]
    path = write(tmp_path / "rows.jsonl", *rows)
    django, requests = load_tasks(TasksConfig(path=str(path), check_requirements=False)).tasks
    assert django.python == "3.8" and django.base_setup_commands[0].startswith("uv venv")
    assert django.setup_commands[-1] == editable_step()  # farm-install-editable, expanded
    # Django's labels from the test patch, its data file left out (SWE-bench's NON_TEST_EXTS)
    assert django.test_command.endswith("runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 foo.tests")
    assert django.log_parser == "parse_log_django"  # the row named none: the recipe's
    assert django.metadata["recipe"] == "django/django@4.0" and django.metadata["recipe_source"] == BUILTIN
    assert requests.test_command == ". .venv/bin/activate && pytest -rA tests/foo/tests.py"
    assert requests.log_parser == "parse_log_requests"  # the row's own
    # The same rows as a Parquet file (test lists as lists, as datasets export them) load the same.
    import pyarrow as pa
    import pyarrow.parquet as pq

    f2p, p2p = ["tests/foo/tests.py::test_y"], ["tests/foo/tests.py::test_x"]
    rows = [row("django/django", "4.0", FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    (from_parquet,) = load_tasks(TasksConfig(path=str(tmp_path / "rows.parquet"), check_requirements=False)).tasks
    assert from_parquet.setup_commands == django.setup_commands and from_parquet.test_command == django.test_command
    assert from_parquet.pass_to_pass == ["tests/foo/tests.py::test_x"]
    assert fill_test_command("t {test_files} | {test_labels}", ["tests/a/b.py", "x.txt", "pkg/test_c.py"]) == (
        "t tests/a/b.py pkg/test_c.py | a.b pkg.test_c"
    )


def test_a_users_file_overrides_the_book_per_repository_version(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "django/django:\n"
        "  '4.0': {python: '3.11', setup: [mine-4.0], test_command: 'mine {test_files}'}\n"
        "psf/requests:\n"
        "  '*': {setup: [mine-any]}\n"
    )
    rows = [row("django/django", "4.0"), row("django/django", "4.1"), row("psf/requests", "2.31"),
            row("pallets/flask", "2.0")]  # fmt: skip
    path = write(tmp_path / "rows.jsonl", *rows)
    d40, d41, req, flask = load_tasks(path, recipes=str(mine), check_requirements=False).tasks
    assert d40.setup_commands == ["mine-4.0"] and d40.python == "3.11" and d40.test_command == "mine tests/foo/tests.py"
    assert d40.base_setup_commands == [] and d40.metadata["recipe_source"] == str(mine)
    assert d41.python == "3.9" and d41.metadata["recipe_source"] == BUILTIN  # a version the file does not name
    assert req.setup_commands == ["mine-any"]  # the file's "*" covers the book's versions too
    assert flask.metadata["recipe_source"] == BUILTIN
    # A list is exactly its sources: without "builtin" the book is out; "none" is no recipes at all.
    only = load_tasks(path, recipes=[str(mine)], check_requirements=False)
    assert [t.id for t in only.tasks] == ["django__django-4.0", "psf__requests-2.31"]
    assert "no recipe for django/django version '4.1'" in str(only.errors[0]) and "4.0" in str(only.errors[0])
    assert only.errors[1].field == "environment" and "pallets/flask" in str(only.errors[1])  # nothing gives it one
    assert all(not t.setup_commands for t in load_tasks(path, recipes="none").tasks)
    assert recipe_sources(None) == [] and recipe_sources(BUILTIN) == [BUILTIN] and TasksConfig().recipes == BUILTIN
    assert recipe_sources("x.yaml") == [BUILTIN, "x.yaml"] and recipe_sources(["x.yaml"]) == ["x.yaml"]


def test_system_only_needs_and_unknown_versions_are_errors_when_rows_load(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        "acme/tool:\n"
        "  '1.0': {setup: [x], requires: [{apt: farm-no-such-pkg, check: 'command:farm-no-such-tool'}]}\n"
        "  '2.0': {setup: [x], requires: [{apt: coreutils, check: 'command:sh'}]}\n"
    )
    own = row("psf/requests", "9.9", instance_id="own", setup_commands=["own"])
    rows = [row("pydata/xarray", "2022.06"), row("acme/tool", "1.0"), row("acme/tool", "2.0"), row("psf/requests", "9.9"), own]
    path = write(tmp_path / "rows.jsonl", *rows)
    result = load_tasks(path, recipes=str(mine))
    # met needs; a row with its own setup; xarray, whose conda environment file PyPI provides in part:
    # what it lacks is left out when the environment is built (farm-conda-env), no row refused for it
    assert [t.id for t in result.tasks] == ["pydata__xarray-2022.06", "acme__tool-2.0", "own"]
    xarray = result.tasks[0].base_setup_commands
    assert xarray[-2] == conda_env_step("ci/requirements/environment.yml") and xarray[-1] == prefix_step()
    apt, version = (str(e) for e in result.errors)
    assert ("system packages farm-no-such-pkg (apt-get in SWE-bench's spec; no command farm-no-such-tool on PATH; "
            "on Debian/Ubuntu: `apt-get install -y farm-no-such-pkg`)") in apt
    assert "install it, or override acme/tool@1.0" in apt
    assert "field 'version': no recipe for psf/requests version '9.9': recipes exist for versions 0.7, 0.8" in version
    with pytest.raises(TaskLoadError, match="a version must be a string: quote it"):
        (tmp_path / "float.yaml").write_text("acme/tool:\n  0.20: {setup: [x]}\n")
        load_tasks(path, recipes=str(tmp_path / "float.yaml"))
    # Checks off (sandboxes on other machines): the rows load with their recipes.
    assert len(load_tasks(path, recipes=str(mine), check_requirements=False).tasks) == 4


def test_a_missing_python_is_reported_with_the_recipe(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("acme/tool:\n  '1.0': {python: '2.5', setup: [x]}\n")
    (err,) = load_tasks(write(tmp_path / "r.jsonl", row("acme/tool", "1.0")), recipes=str(mine)).errors
    assert "needs what this machine lacks: python 2.5: no python 2.5 on this machine" in str(err)
    assert "install it, or override acme/tool@1.0" in str(err)


@pytest.mark.slow
def test_a_swebench_row_of_a_book_repository_validates_with_only_a_mirror(tmp_path: Path) -> None:
    """requests 2.31.0's sdist as repository psf/requests, a bug and the test patch that finds
    it, as a SWE-bench row: `farm validate-tasks` with the row's file and a mirror directory
    and nothing else (the book's recipe, real uv setup in a local sandbox): gold resolves,
    the empty patch does not."""
    from testkit.sdist_task import REQUESTS, make_book_task

    made = make_book_task(tmp_path / "row", REQUESTS)
    # as some published rows have it (pytest-dev__pytest-5227): an id no run reports, a dataset defect
    (published,) = [json.loads(line) for line in made["tasks"].read_text().splitlines()]
    published["PASS_TO_PASS"] = json.dumps([*json.loads(published["PASS_TO_PASS"]), "[100%]"])
    made["tasks"].write_text(json.dumps(published) + "\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run(
        [sys.executable, "-m", "farm", "validate-tasks", str(made["tasks"]), "--report", str(tmp_path / "r.json"),
         "--set", f"tasks.mirror_dir={made['mirrors']}", "--set", f"envs.cache_dir={tmp_path / 'envs'}",
         "--set", f"sandbox.local.base_dir={tmp_path / 'sb'}", "--set", f"tasks.cache_dir={tmp_path / 'tc'}"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    (result,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert result["valid"], result
    assert result["reason"] == ("dataset defect, left out of its lists: PASS_TO_PASS '[100%]' is not a test (SWE-bench's "
                                "log parser read pytest's progress column of an inner run as a test name)")
    gold, empty = result["gold"], result["empty"]
    steps = [s["command"] for s in gold["setup"]["steps"]]
    assert steps[2] == prefix_step()  # after the base setup: the venv made a prefix
    assert steps[0] == "uv venv -q --seed .venv" and steps[-1] == "uv pip install -q --python .venv/bin/python ."
    assert gold["test"]["command"] == ". .venv/bin/activate && pytest -rA tests/test_structures.py"
    assert "Python 3.9" in gold["test"]["stdout_tail"]  # the recipe's python, found on this machine
    assert all(gold["tests"][t] == "PASSED" for t in REQUESTS.fail_to_pass + REQUESTS.pass_to_pass)
    assert {empty["tests"][t] for t in REQUESTS.fail_to_pass} == {"FAILED"}
