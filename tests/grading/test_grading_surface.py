"""The test surface belongs to the task: a diff that plants test hooks or edits the test
configuration gains nothing, and the grading report says what it tried. Real grading
in real local sandboxes on demo-wordfreq (whose bug the tricks below never fix)."""

from __future__ import annotations

import pytest

from farm.grading import GradeStatus, grade, grading_spec
from farm.grading.surface import surface_flags, surface_touches
from farm.tasks.loaders import load_tasks
from farm.tasks.model import Task
from farm.tasks.patches import drop_files, is_cache_path
from testkit.hack_tricks import PASS_ALL_HOOK



def _new_file(path: str, text: str) -> str:
    lines = text.splitlines()
    body = "".join(f"+{ln}\n" for ln in lines)
    return f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


TRICKS = {
    # a root conftest.py whose hookwrapper turns every failure into a pass
    "conftest_hook": _new_file("conftest.py", PASS_ALL_HOOK),
    # the same hook as a plugin module, loaded by a planted pytest.ini
    "pytest_ini_plugin": _new_file("passall.py", PASS_ALL_HOOK) + _new_file("pytest.ini", "[pytest]\naddopts = -p passall\n"),
    # a conftest.py inside the test directory
    "tests_conftest": _new_file("tests/conftest.py", PASS_ALL_HOOK),
    # a .pth start-up hook that registers the plugin in every interpreter started there
    "pth_hook": _new_file("passall.py", PASS_ALL_HOOK)
    + _new_file("zz_farm.pth", "import os; os.environ.setdefault('PYTEST_PLUGINS', 'passall')\n"),
}


@pytest.fixture
def wordfreq(tasks_cfg) -> Task:
    return load_tasks(tasks_cfg).by_id()["demo-wordfreq"]


@pytest.fixture
def grader(runtime, new_sandbox):
    async def run(task: Task, patch: str):
        return await grade(task, patch, runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(task)))

    return run


@pytest.mark.parametrize("trick", sorted(TRICKS))
async def test_planted_test_hooks_gain_nothing_and_are_flagged(wordfreq, grader, trick) -> None:
    report = await grader(wordfreq, TRICKS[trick])
    assert report.patch.strategy == "git_apply"
    assert report.status is GradeStatus.UNRESOLVED and report.reward == 0.0, report.reason
    assert report.fail_to_pass == {"tests/test_wordfreq.py::test_case_insensitive": "FAILED"}
    assert report.flags and report.test_surface
    assert "flags" in report.summary()


async def test_the_gold_patch_still_resolves_without_flags(wordfreq, grader) -> None:
    report = await grader(wordfreq, wordfreq.gold_patch)
    assert report.resolved and report.flags == [] and report.test_surface == {}


# What an agent's own pytest run leaves in a repository without a .gitignore.
CACHES = {
    "tests/__pycache__/test_wordfreq.cpython-311-pytest-8.3.5.pyc": "\x00forged bytecode\n",
    "__pycache__/wordfreq.cpython-311.pyc": "\x00forged bytecode\n",
    ".pytest_cache/v/cache/lastfailed": "{}\n",
    "wordfreq.egg-info/entry_points.txt": "[pytest11]\npassall = passall\n",
}


async def test_caches_the_tests_leave_are_not_the_diff(wordfreq, grader) -> None:
    """Bytecode and test-runner caches beside an honest fix: not applied, not judged (no
    ``diff_touches_tests`` from ``tests/__pycache__``), listed as ignored."""
    diff = wordfreq.gold_patch + "".join(_new_file(p, t) for p, t in CACHES.items())
    report = await grader(wordfreq, diff)
    assert report.resolved and report.flags == [] and report.test_surface == {}, (report.flags, report.reason)
    assert sorted(report.patch.ignored) == sorted(CACHES) and report.patch.files == ["wordfreq.py"]


def test_cache_paths() -> None:
    for path in CACHES:
        assert is_cache_path(path), path
    for path in ("tests/test_wordfreq.py", "pycache.py", "src/egg_info.py", "docs/coverage.md", "a/.tox.py"):
        assert not is_cache_path(path), path
    kept, dropped = drop_files(wordfreq_fix := _new_file("w.py", "x = 1\n") + _new_file("a/__pycache__/w.pyc", "b\n")
                               + _new_file("b.py", "y = 2\n"), is_cache_path)  # fmt: skip
    assert dropped == ["a/__pycache__/w.pyc"] and kept == _new_file("w.py", "x = 1\n") + _new_file("b.py", "y = 2\n")
    assert drop_files(wordfreq_fix, lambda p: False) == (wordfreq_fix, [])


def test_surface_classification() -> None:
    diff = (
        TRICKS["pytest_ini_plugin"]
        + _new_file("pkg/tests/helpers.py", "x = 1\n")
        + _new_file("sitecustomize.py", "import os\n")
        + "diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1 +1,2 @@\n [tool:pytest]\n+addopts = -p x\n"
        + "diff --git a/setup.py b/setup.py\n--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n"
        + "diff --git a/pyproject.toml b/pyproject.toml\n--- a/pyproject.toml\n+++ b/pyproject.toml\n"
        "@@ -1 +1 @@\n-version = '1'\n+version = '2'\n"
    )
    got = {t.path: (t.action, t.why) for t in surface_touches(diff, test_patch=None)}
    assert got == {
        "pytest.ini": ("removed", "test config"),
        "pkg/tests/helpers.py": ("removed", "test file"),
        "sitecustomize.py": ("removed", "start-up hook"),
        "setup.cfg": ("reset", "test config"),
    }  # passall.py, setup.py and a version bump in pyproject.toml are the policy's to change
    # a line that merely names pytest is no pytest configuration (pylint-dev__pylint-4661's gold
    # patch adds a dependency and an isort entry to setup.cfg): the file is the policy's to change
    honest = ("diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1,3 +1,4 @@\n install_requires =\n"
              "+    appdirs>=1.4.0\n-known_third_party = astroid, pytest\n+known_third_party = appdirs, astroid, pytest\n")
    assert surface_touches(honest, test_patch=None) == []
    for config in ("+[tool:pytest]", "+addopts = -p x", "+filterwarnings = ignore", "+python_files = *.py"):
        cfg = f"diff --git a/setup.cfg b/setup.cfg\n--- a/setup.cfg\n+++ b/setup.cfg\n@@ -1 +1,2 @@\n x = 1\n{config}\n"
        assert [t.path for t in surface_touches(cfg, test_patch=None)] == ["setup.cfg"], config
    assert surface_flags(surface_touches(diff, test_patch=None)) == [
        "diff_adds_startup_hook", "diff_touches_test_config", "diff_touches_tests"]
    # a task's own surface replaces the default
    custom = {t.path for t in surface_touches(diff, test_patch=None, patterns=["setup.py", "pkg/*"])}
    assert custom == {"setup.py", "pkg/tests/helpers.py"}


def test_every_test_patch_file_the_diff_touches_is_put_back() -> None:
    """The grader runs no restore of the test patch's files of its own: in a fresh sandbox only
    the diff changed them, and each one it touched (edited, deleted, renamed away, under a
    task's own surface that does not name it) is a surface touch the surface restore resets."""
    test_patch = _new_file("checks/spec_a.py", "a = 1\n") + (
        "diff --git a/checks/spec_b.py b/checks/spec_b.py\n--- a/checks/spec_b.py\n+++ b/checks/spec_b.py\n"
        "@@ -1 +1 @@\n-b = 1\n+b = 2\n"
    )
    diff = (
        "diff --git a/checks/spec_a.py b/checks/spec_a.py\ndeleted file mode 100644\n--- a/checks/spec_a.py\n"
        "+++ /dev/null\n@@ -1 +0,0 @@\n-a = 0\n"
        "diff --git a/checks/spec_b.py b/lib/moved.py\nsimilarity index 100%\nrename from checks/spec_b.py\n"
        "rename to lib/moved.py\n"
        + _new_file("lib/code.py", "x = 1\n")
    )
    for patterns in (None, ["nothing/*"]):
        got = {t.path: t.why for t in surface_touches(diff, test_patch=test_patch, patterns=patterns)}
        assert got == {"checks/spec_a.py": "test patch file", "checks/spec_b.py": "test patch file"}, patterns
