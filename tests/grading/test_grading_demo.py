"""Grading on the demo set in real local (bubblewrap) sandboxes: gold, empty, partial, test
tampering, garbage, fuzz, hangs, broken setup, and the agent -> capture -> grade path."""

from __future__ import annotations

import pytest

from farm.grading import GradeStatus, grade, grading_spec, validate_tasks
from farm.sandboxes.base import SandboxSpec
from farm.status import RolloutStatus
from farm.workspace.capture import capture_diff
from farm.tasks.loaders import load_tasks
from farm.tasks.model import Task, TaskTimeouts
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import prepare_workspace


@pytest.fixture
def demo(tasks_cfg) -> dict[str, Task]:
    return load_tasks(tasks_cfg).by_id()


@pytest.fixture
def grader(runtime, new_sandbox):
    async def run(task: Task, patch, rt: TaskRuntime | None = None):
        return await grade(task, patch, runtime=rt or runtime, make_sandbox=lambda: new_sandbox(grading_spec(task)))

    return run


@pytest.mark.slow
async def test_whole_demo_set_validates(demo, runtime, new_sandbox) -> None:
    results = await validate_tasks(list(demo.values()), runtime=runtime, new_sandbox=new_sandbox, concurrency=4)
    invalid = {r.task_id: r.reason for r in results if not r.valid}
    assert not invalid
    for r in results:
        assert r.gold.resolved and r.gold.reward == 1.0 and not r.empty.resolved, r.task_id
        assert not r.gold.flags and not r.empty.flags, (r.task_id, r.gold.flags, r.empty.flags)  # no finding
        if r.kind == "swe":
            assert set(r.gold.fail_to_pass.values()) == {"PASSED"}, r.task_id
            assert r.gold.patch.strategy == "git_apply" and r.empty.patch.strategy == "empty"
            # The empty patch: every PASS_TO_PASS passes, no FAIL_TO_PASS does.
            assert set(r.empty.pass_to_pass.values()) == {"PASSED"}, r.task_id
            assert "PASSED" not in set(r.empty.fail_to_pass.values()), r.task_id
            assert r.empty.outcome().status is RolloutStatus.COMPLETED and r.empty.reward == 0.0
    fizz = next(r for r in results if r.task_id == "demo-generic-fizzbuzz")
    assert fizz.empty.reward_file_value == pytest.approx(16 / 30) and fizz.empty.reward == pytest.approx(16 / 30)
    assert fizz.gold.reward_file_value == 1.0
    summary = results[0].gold.summary()
    assert summary["status"] == "resolved" and summary["f2p"] == "2/2" and summary["p2p"] == "3/3"


PARTIAL_DURATIONS = """diff --git a/durations.py b/durations.py
--- a/durations.py
+++ b/durations.py
@@ -10,7 +10,7 @@ _PART = re.compile(r"(\\d+)([hms])")
 
 def parse_duration(text: str) -> int:
     \"\"\"Seconds in a duration made of <number><unit> parts (units h, m, s).\"\"\"
-    match = _PART.match(text.strip())
-    if not match:
+    parts = _PART.findall(text.strip())
+    if not parts:
         raise ValueError(f"bad duration: {text!r}")
-    return int(match.group(1)) * _UNITS[match.group(2)]
+    return sum(int(n) * _UNITS[unit] for n, unit in parts)
"""


@pytest.mark.slow
async def test_partial_fix_is_not_resolved(demo, runtime, grader) -> None:
    task = demo["demo-durations"]
    report = await grader(task, PARTIAL_DURATIONS)
    assert report.status is GradeStatus.UNRESOLVED and report.reward == 0.0
    assert report.fail_to_pass == {
        "tests/test_durations.py::test_compound": "PASSED",
        "tests/test_durations.py::test_trailing_garbage": "FAILED",
    }
    assert "1/2 FAIL_TO_PASS not passing" in report.reason
    partial_rt = TaskRuntime(runtime.config.model_copy(update={"partial_credit": True}), runtime.repos, runtime.path_prefix)
    credited = await grader(task, PARTIAL_DURATIONS, partial_rt)
    assert credited.reward == 0.5 and not credited.resolved


def _rewrite_tests(path: str, content: str) -> str:
    """A diff replacing a test file's import (what a reward-hacking agent might do)."""
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,4 +1,4 @@\n"
        f"-from slugs import slugify\n+{content}\n \n \n def test_simple():\n"
    )


async def test_edits_to_test_files_are_overridden_by_the_test_patch(demo, grader) -> None:
    task = demo["demo-slugs"]
    # The agent's version of the test file would pass without any fix.
    answers = "{'Hello': 'hello', '  hi  ': 'hi', 'Crème': 'creme', 'Hello, World!': 'hello-world', 'a -- b': 'a_b'}"
    hack = _rewrite_tests("tests/test_slugs.py", f"slugify = lambda text, sep='-': {answers}[text]")
    cheat = await grader(task, hack)
    assert cheat.patch.strategy == "git_apply"
    assert cheat.status is GradeStatus.UNRESOLVED
    assert cheat.fail_to_pass == {"tests/test_slugs.py::test_collapses_separators": "FAILED"}
    honest_plus_hack = await grader(task, task.gold_patch + hack)
    assert honest_plus_hack.resolved, honest_plus_hack.reason


async def test_a_fake_junit_report_in_the_diff_is_discarded(demo, grader) -> None:
    task = demo["demo-csvline"]
    fake = (
        '<testsuite><testcase classname="tests.test_csvline" name="test_quoted_delimiter"/>'
        '<testcase classname="tests.test_csvline" name="test_escaped_quote"/></testsuite>'
    )
    diff = f"diff --git a/junit.xml b/junit.xml\nnew file mode 100644\n--- /dev/null\n+++ b/junit.xml\n@@ -0,0 +1 @@\n+{fake}\n"
    report = await grader(task, diff)
    assert report.patch.strategy == "git_apply" and report.status is GradeStatus.UNRESOLVED
    assert report.fail_to_pass["tests.test_csvline.test_quoted_delimiter"] == "FAILED"


async def test_garbage_diff_is_patch_failed(demo, grader) -> None:
    task = demo["demo-wordfreq"]
    garbage = "diff --git a/wordfreq.py b/wordfreq.py\n--- a/wordfreq.py\n+++ b/wordfreq.py\n@@ -1,2 +1,2 @@\n-no such line\n+nope\n"
    for patch in (garbage, "this is not a diff at all\n"):
        report = await grader(task, patch)
        assert report.status is GradeStatus.PATCH_FAILED and report.reward == 0.0 and not report.resolved
        assert report.patch.strategy is None and [a.command for a in report.patch.attempts] == [
            "git_apply", "git_apply_3way", "patch_fuzz",
        ]
        assert report.outcome().status is RolloutStatus.PATCH_FAILED and report.test is None


async def test_fuzzy_diff_falls_back_to_patch(demo, grader) -> None:
    task = demo["demo-semverlite"]
    # The gold fix with a stale context line and no blob ids: git apply and --3way refuse.
    fuzzy = "\n".join(
        line.replace('    parts = version.strip().lstrip("v").split(".")', '    parts = version.split(".")  # old')
        for line in task.gold_patch.splitlines()
        if not line.startswith("index ")
    ) + "\n"
    assert fuzzy != task.gold_patch
    report = await grader(task, fuzzy)
    assert report.patch.strategy == "patch_fuzz", report.patch.attempts
    assert report.resolved


async def test_hanging_test_command_times_out(demo, grader) -> None:
    task = demo["demo-lrucache"].model_copy(
        update={"test_command": "python -c 'import time; time.sleep(120)'", "timeouts": TaskTimeouts(test_s=1.5)}
    )
    report = await grader(task, task.gold_patch)
    assert report.status is GradeStatus.TEST_TIMEOUT and report.reward == 0.0
    assert report.test.timed_out and "exceeded 1.5 s" in report.reason
    assert report.outcome().status is RolloutStatus.COMPLETED


async def test_failing_setup_in_the_grading_sandbox(demo, grader) -> None:
    task = demo["demo-romans"].model_copy(update={"setup_commands": ["exit 7"]})
    report = await grader(task, task.gold_patch)
    assert report.status is GradeStatus.SETUP_FAILED and report.setup.steps[0].exit_code == 7
    assert report.outcome().status is RolloutStatus.SETUP_FAILED


@pytest.mark.slow  # over 10 s: a real environment built and graded
async def test_broken_task_is_an_error_not_a_zero(demo, grader) -> None:
    task = demo["demo-intervals"]
    broken = task.model_copy(update={"test_patch": task.test_patch.replace("+from intervals", "+from nowhere").replace("new file mode 100644\n", "new file mode 100644\n", 1)})
    bad_tp = task.model_copy(update={"test_patch": "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"})
    report = await grader(bad_tp, task.gold_patch)
    assert report.status is GradeStatus.ERROR and "test patch does not apply" in report.reason
    assert report.outcome().status is RolloutStatus.SETUP_FAILED
    unknown = await grader(task.model_copy(update={"log_parser": "nose"}), task.gold_patch)
    assert unknown.status is GradeStatus.ERROR and "unknown log parser" in unknown.reason
    # A test patch whose tests import a module nothing provides (not the environment, not the repository,
    # not the gold patch): the environment cannot run them, with the gold patch or without: infrastructure.
    missing = await grader(broken, task.gold_patch)
    assert missing.status is GradeStatus.ENV_BROKEN and "nowhere" in missing.reason, missing.reason
    assert "the same without the diff" in missing.reason and missing.outcome().status is RolloutStatus.SETUP_FAILED


async def test_reward_file_brought_by_the_diff_is_ignored(demo, grader) -> None:
    task = demo["demo-generic-fizzbuzz"].model_copy(update={"reward_file": "reward.txt"})
    forged = "diff --git a/reward.txt b/reward.txt\nnew file mode 100644\n--- /dev/null\n+++ b/reward.txt\n@@ -0,0 +1 @@\n+1.0\n"
    report = await grader(task, forged)
    assert report.reward == pytest.approx(16 / 30) and not report.resolved
    silent = task.model_copy(update={"verify_commands": ["true", "false", "echo not-a-float > \"$FARM_REWARD_FILE\""]})
    fallback = await grader(silent, "")
    assert fallback.reward == pytest.approx(2 / 3) and fallback.reward_file_value is None
    assert "not a float" in fallback.reason


@pytest.mark.slow  # over 10 s: a real environment built and graded
async def test_agent_work_captured_then_graded(demo, runtime, new_sandbox, grader) -> None:
    task = demo["demo-semverlite"]
    async with await new_sandbox(SandboxSpec(labels={"run_id": "t"})) as agent_sb:
        ws = await prepare_workspace(agent_sb, task, runtime)
        # A stand-in for the agent: applies the fix its own way, commits, and farm's harness
        # left its instructions file in the repo.
        await agent_sb.write_file(f"{ws.scratch}/fix.patch", task.gold_patch)
        res = await agent_sb.exec(
            f"git apply {ws.scratch}/fix.patch && git -c user.name=a -c user.email=a@a commit -qam wip && "
            "echo 'You are an agent' > AGENTS.md && python -m pytest -q -p no:cacheprovider >/dev/null; true",
            cwd=ws.workdir, timeout=120,
        )
        assert res.exit_code == 0, res.stderr
        captured = await capture_diff(agent_sb, ws, exclude=["AGENTS.md"])
    assert captured.files == ["semverlite.py"]
    report = await grader(task, captured)
    assert report.resolved and report.patch.files == ["semverlite.py"]


@pytest.mark.slow  # over 10 s: a real environment built and graded
async def test_r2e_style_expected_statuses_and_oversized_diffs(demo, grader) -> None:
    from farm.workspace.capture import CapturedDiff

    base = demo["demo-lrucache"]
    names = ["test_put_get", "test_evicts_oldest", "test_update_refreshes", "test_get_refreshes"]
    task = base.model_copy(
        update={"fail_to_pass": [], "pass_to_pass": [], "log_parser": "r2e",
                "expected_test_statuses": {n: "PASSED" for n in names}}
    )
    gold = await grader(task, task.gold_patch)
    assert gold.resolved and not gold.expected_mismatches
    empty = await grader(task, "")
    assert not empty.resolved and empty.expected_mismatches == {"test_get_refreshes": ["PASSED", "FAILED"]}
    huge = await grader(task, CapturedDiff(patch="diff --git a/x b/x\n", bytes=10**9, too_large=True))
    assert huge.status is GradeStatus.PATCH_FAILED and "over tasks.max_diff_bytes" in huge.reason


# a PASS_TO_PASS test that calls a host on the internet, as requests' and sphinx's rows have
REACH_TEST = """diff --git a/tests/test_reach.py b/tests/test_reach.py
new file mode 100644
--- /dev/null
+++ b/tests/test_reach.py
@@ -0,0 +1,9 @@
+import socket
+
+import durations
+
+
+def test_resolves_a_host():
+    socket.getaddrinfo("pypi.org", 443)
+def test_hours_here_too():
+    assert durations.parse_duration("7h") == 25200
"""
@pytest.mark.slow  # three gradings in real sandboxes
async def test_p2p_tests_that_need_the_internet_are_not_judged_offline(demo, grader) -> None:
    task = demo["demo-durations"]
    reach = "tests/test_reach.py::test_resolves_a_host"
    online = task.model_copy(update={
        "test_patch": task.test_patch + REACH_TEST,
        "test_command": task.test_command.replace("tests/test_durations.py", "tests/test_durations.py tests/test_reach.py"),
        "pass_to_pass": [*task.pass_to_pass, reach, "tests/test_reach.py::test_hours_here_too"],
    })  # fmt: skip
    # the gold patch resolves: the test that cannot reach its host fails without the diff too
    report = await grader(online, task.gold_patch)
    assert report.pass_to_pass[reach] == "FAILED" and report.resolved, report.reason
    assert "p2p_needs_network" in report.flags and reach in report.flag_details["p2p_needs_network"]
    assert report.outcome().status is RolloutStatus.COMPLETED and report.reward == 1.0
    # a diff that breaks a passing test with a failure that prints a name-resolution error is judged:
    # without the diff that test passes, so nothing excuses it
    fake = task.gold_patch.replace("@@ -8,7 +8,7 @@", "@@ -8,7 +8,9 @@").replace(
        "+    text = text.strip()\n",
        '+    text = text.strip()\n+    if text == "7h":\n+        raise OSError("[Errno -3] Temporary failure in name resolution")\n')  # fmt: skip
    assert fake != task.gold_patch
    broken = await grader(online, fake)
    assert broken.pass_to_pass["tests/test_reach.py::test_hours_here_too"] == "FAILED"
    assert not broken.resolved and "p2p_needs_network" in broken.flags, broken.reason
    assert "test_hours_here_too" in broken.reason and reach not in broken.reason
