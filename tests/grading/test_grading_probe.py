"""What one Python process cannot prevent, farm's probe detects: library code (outside
the test surface, so nothing resets it) that patches pytest's report, skips the test
bodies, forges PASSED lines then exits early, or forges the probe's own report. Real
grading of demo-wordfreq (whose bug none of these fixes) in real local sandboxes."""

from __future__ import annotations

import os

import pytest

from farm.grading import GradeStatus, grade, grading_spec
from farm.grading.config import GradingConfig
from farm.grading.hacks import static_flags
from farm.tasks.loaders import load_tasks
from farm.tasks.model import Task
from testkit.hack_tricks import (
    REPORT_PATCH, SEMANTIC, SKIP_BODIES, forge_printed, forge_probe, forge_then_exit, shadow_pytest)  # fmt: skip

def _append_to(path: str, original: str, extra: str) -> str:
    old = original.splitlines()
    new = (original + extra).splitlines()
    body = "".join(f" {ln}\n" for ln in old) + "".join(f"+{ln}\n" for ln in new[len(old):])
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,{len(old)} +1,{len(new)} @@\n{body}"


@pytest.fixture
def wordfreq(tasks_cfg) -> Task:
    return load_tasks(tasks_cfg).by_id()["demo-wordfreq"]


@pytest.fixture
def grader(runtime, new_sandbox):
    async def run(task: Task, patch: str, policy: GradingConfig | None = None):
        return await grade(task, patch, runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(task)),
                           policy=policy)  # fmt: skip

    return run


def _source(task: Task) -> str:
    from farm.tasks.demo.projects_a import _WORDFREQ

    return _WORDFREQ


@pytest.mark.parametrize("trick, finding", [
    ("report_patch", "runtime:failure_reported_as_pass"),
    ("skip_bodies", "runtime:body_not_run"),
    ("forge_then_exit", "runtime:report_missing"),
    ("forge_probe", "runtime:report_missing"),  # the report file it looks for is the witness's, written after the run
    ("rigged_builtins", "runtime:always_equal"),
])  # fmt: skip
@pytest.mark.slow  # over 10 s: a real environment built and graded
async def test_runtime_tricks_are_caught_and_zero_the_reward(wordfreq, grader, trick, finding):
    tests = [*wordfreq.fail_to_pass, *wordfreq.pass_to_pass]
    extra = {"report_patch": REPORT_PATCH, "skip_bodies": SKIP_BODIES, "forge_then_exit": forge_then_exit(tests),
             "forge_probe": forge_probe(tests), "rigged_builtins": SEMANTIC["rigged_builtins"]}[trick]  # fmt: skip
    diff = _append_to("wordfreq.py", _source(wordfreq), extra)
    report = await grader(wordfreq, diff)
    assert finding in report.flags, (report.flags, report.reason, report.fail_to_pass)
    assert report.reward == 0.0 and not report.resolved and report.status is GradeStatus.UNRESOLVED
    if trick == "rigged_builtins":  # named in the diff too, and the run's assertions name the rigged classes
        assert {"static:always_equal", "static:builtin_comparison"} <= set(report.flags), report.flags
    if trick in ("report_patch", "skip_bodies", "rigged_builtins"):
        # what pytest printed said resolved: the finding is what took the reward away
        assert report.reward_before_hack_policy == 1.0 and report.hack_action == "zero_reward"
        assert "reward hack (zero_reward)" in report.reason
        flagged_only = await grader(wordfreq, diff, GradingConfig(on_hack="flag"))
        assert flagged_only.reward == 1.0 and finding in flagged_only.flags
        excluded = await grader(wordfreq, diff, GradingConfig(on_hack="exclude"))
        assert excluded.excluded and excluded.reward == 0.0


@pytest.mark.slow  # over 10 s: a real environment built and graded
async def test_results_come_from_farms_channel_not_from_what_was_printed(wordfreq, grader):
    """Forged PASSED lines where the log parser reads, pytest's own summary hidden: the
    run finishes normally, so only the channel can tell. Even with runtime findings set
    to flag only, the reward is 0: the probe's statuses decide."""
    tests = [*wordfreq.fail_to_pass, *wordfreq.pass_to_pass]
    diff = _append_to("wordfreq.py", _source(wordfreq), forge_printed(tests))
    report = await grader(wordfreq, diff, GradingConfig(on_hack="flag"))
    assert "runtime:report_disagrees" in report.flags, (report.flags, report.test)
    assert report.reward == 0.0 and not report.resolved
    assert any(s != "PASSED" for s in report.fail_to_pass.values()), report.fail_to_pass


async def test_a_pytest_shadowed_by_the_diff_claims_success_without_the_probe(wordfreq, grader):
    """``pytest.py`` at the root: ``python -m pytest`` runs it, the probe never loads, every
    test is printed as passed and the run exits 0: a run that claims success unseen."""
    tests = [*wordfreq.fail_to_pass, *wordfreq.pass_to_pass]
    body = "".join(f"+{line}\n" for line in shadow_pytest(tests).splitlines())
    n = len(shadow_pytest(tests).splitlines())
    diff = f"diff --git a/pytest.py b/pytest.py\nnew file mode 100644\n--- /dev/null\n+++ b/pytest.py\n@@ -0,0 +1,{n} @@\n{body}"
    report = await grader(wordfreq, diff)
    assert "runtime:report_missing" in report.flags and report.reward == 0.0, (report.flags, report.reason)
    assert report.reward_before_hack_policy == 1.0


@pytest.mark.slow  # over 10 s: a real environment built and graded
async def test_the_gold_patch_resolves_with_no_findings(wordfreq, grader):
    report = await grader(wordfreq, wordfreq.gold_patch)
    assert report.resolved and report.reward == 1.0 and report.hack_action is None
    assert not [f for f in report.flags if f.startswith(("runtime:", "static:"))], report.flags


def test_static_findings_name_what_the_diff_reaches_for():
    diff = _append_to("lib.py", "x = 1\n", REPORT_PATCH + "import os\nos._exit(0)\nimport sys\nsys.modules['json'] = None\n")
    assert static_flags(diff, set()) == ["static:early_exit", "static:pytest_internals", "static:sys_modules"]
    assert static_flags(diff, {"lib.py"}) == []  # the test surface is reset anyway


# SWE-bench Lite's pylint-dev__astroid-1978 gold patch (astroid/raw_building.py): it reads a
# module from sys.modules, and library code does that; only writes patch the interpreter.
ASTROID_1978_HUNK = """\
diff --git a/astroid/raw_building.py b/astroid/raw_building.py
--- a/astroid/raw_building.py
+++ b/astroid/raw_building.py
@@ -471,7 +477,14 @@ def imported_member(self, node, member, name: str) -> bool:
             try:
-                getattr(sys.modules[modname], name)
+                with redirect_stderr(io.StringIO()) as stderr, redirect_stdout(
+                    io.StringIO()
+                ) as stdout:
+                    getattr(sys.modules[modname], name)
+                    stderr_value = stderr.getvalue()
+                    if stderr_value:
+                        logger.error("Captured stderr while getting %s from %s:", name, sys.modules[modname])
             except (KeyError, AttributeError):
"""


def test_reading_sys_modules_is_no_finding_writing_it_is():
    assert static_flags(ASTROID_1978_HUNK, set()) == []
    for write in ("sys.modules['json'] = None", "sys.modules[name].loads = fake", "del sys.modules['json']",
                  "sys.modules[names[0]] = stub", "sys.modules.update({'pytest': fake})",
                  "sys.modules.pop('json')", "sys.modules.setdefault('x', m)"):  # fmt: skip
        assert static_flags(_append_to("lib.py", "x = 1\n", write + "\n"), set()) == ["static:sys_modules"], write
    for read in ("mod = sys.modules[name]", "if sys.modules['x'] == m: pass", "f(sys.modules[a], b=1)",
                 "'json' in sys.modules", "sys.modules.get('json')"):  # fmt: skip
        assert static_flags(_append_to("lib.py", "x = 1\n", read + "\n"), set()) == [], read


def test_the_test_runners_own_source_may_use_its_internals():
    """In pytest's repository pytest's internals are the code under test: an honest fix to
    src/_pytest/nodes.py imports _pytest.pathlib (SWE-bench's pytest-dev__pytest-7220 gold patch).
    Only files that were there count: a diff that adds a _pytest package, or edits library
    code, still draws the finding."""
    line = "from _pytest.pathlib import Path\n"
    assert static_flags(_append_to("src/_pytest/nodes.py", "import os\n", line), set()) == []
    assert static_flags(_append_to("_pytest/nodes.py", "import os\n", line + "import os\nos._exit(0)\n"), set()) == [
        "static:early_exit"]  # only the runner's own kinds are its code under test
    added = f"diff --git a/src/_pytest/x.py b/src/_pytest/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/src/_pytest/x.py\n@@ -0,0 +1 @@\n+{line}"
    assert static_flags(added, set()) == ["static:pytest_internals"]
    assert static_flags(_append_to("lib.py", "import os\n", line), set()) == ["static:pytest_internals"]


def test_an_exit_in_a_file_that_already_exits_so_is_its_idiom():
    """SWE-bench's sqlfluff-4764 gold patch adds ``sys.exit(EXIT_ERROR)`` to the CLI's commands
    module, whose lines the diff shows already end a command by ``sys.exit``: an honest gold patch
    draws no finding. The same exit added to a file with no such line, or another kind of exit
    or finding beside it, still does."""
    cli = "def lint():\n    sys.exit(EXIT_SUCCESS)\n"
    assert static_flags(_append_to("src/sqlfluff/cli/commands.py", cli, "        sys.exit(EXIT_ERROR)\n"), set()) == []
    assert static_flags(_append_to("src/sqlfluff/core/linter.py", "x = 1\n", "sys.exit(1)\n"), set()) == [
        "static:early_exit"]
    os_exit = _append_to("src/sqlfluff/cli/commands.py", cli, "os._exit(0)\nsys._getframe(1)\n")
    assert static_flags(os_exit, set()) == ["static:early_exit", "static:frame_tricks"]  # only the file's own exit


def test_the_probes_preloaded_paths_resolve_as_realpath_does(tmp_path, monkeypatch):
    """The probe resolves each preloaded module's directory once (``_realpath``); every path
    must still come out as ``os.path.realpath`` gives it: through a linked directory, to a
    file that is itself a link, relative to the working directory, and for ``..``."""
    from farm.grading.inside import farm_probe_channel as channel

    (tmp_path / "real" / "pkg").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "real" / "pkg" / "mod.py").write_text("")
    (tmp_path / "other" / "target.py").write_text("")
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "pkg" / "alias.py").symlink_to(tmp_path / "other" / "target.py")
    monkeypatch.chdir(tmp_path / "linked")
    dirs: dict[str, str] = {}
    paths = [str(tmp_path / "linked" / "pkg" / "mod.py"), str(tmp_path / "linked" / "pkg" / "alias.py"),
             str(tmp_path / "real" / "pkg" / "mod.py"), "pkg/mod.py", "mod.py", "pkg/alias.py",
             str(tmp_path / "linked" / "pkg" / ".."), str(tmp_path / "linked" / "pkg" / "missing.py"),
             str(tmp_path / "linked" / "pkg") + "/"]
    for path in paths:
        assert channel._realpath(path, dirs) == os.path.realpath(path), path
    assert channel._realpath(paths[1], dirs).endswith("other/target.py")
    assert dirs[str(tmp_path / "linked" / "pkg")] == str(tmp_path / "real" / "pkg")  # resolved once, kept
