"""The grader's work before the test command is ONE jailed command (farm.grading.steps),
and every step in it is still reported as if it had run on its own."""

from __future__ import annotations

import pytest

import farm.grading.grader as grader_module
from farm.grading import GradeStatus, grade, grading_spec
from farm.grading.steps import StepScript
from farm.sandboxes.base import SandboxSpec
from farm.tasks.loaders import load_tasks
from farm.workspace.prepare import prepare_workspace


async def test_steps_in_one_command_keep_their_own_results(new_sandbox) -> None:
    sandbox = await new_sandbox(SandboxSpec())
    try:
        calls = _count_execs(sandbox)
        script = StepScript(keep_bytes=64)
        script.add("a", "printf 'one\\ntwo'; printf 'err' >&2")  # no trailing newline: kept exactly
        script.add("b", "echo out; echo oops >&2; exit 3", then="|| true")
        script.add("c", "head -c 200 /dev/zero | tr '\\0' x; echo", then="|| exit 0")  # over keep_bytes: the tail
        script.add("d", "exit 5", then="|| exit 0")  # stops the script
        script.add("never", "echo should not run")
        results = await script.run(sandbox, cwd=sandbox.root)
        assert len(calls) == 1
        assert [s.name for s in results.steps] == ["a", "b", "c", "d"]
        a, b, c, d = results.steps
        assert (a.exit_code, a.stdout, a.stderr) == (0, "one\ntwo", "err")
        assert (b.exit_code, b.stdout, b.stderr) == (3, "out\n", "oops\n")
        assert c.ok and c.stdout == "x" * 63 + "\n"
        assert d.exit_code == 5 and not d.ok and results.get("never") is None
        assert (d.stdout, d.stderr) == ("", "")  # nothing printed: nothing framed (no tail run)
        assert all(s.duration_s >= 0 for s in results.steps)
    finally:
        await sandbox.close()


def _count_writes(sandbox) -> list[list[str]]:
    """The paths of every write call from here on (write_file: one path), one list a call."""
    calls: list[list[str]] = []
    real_one, real_many = sandbox.write_file, sandbox.write_files

    async def one(path, data):
        calls.append([path])
        return await real_one(path, data)

    async def many(files):
        calls.append(list(files))
        return await real_many(files)

    sandbox.write_file, sandbox.write_files = one, many
    return calls


def _count_execs(sandbox) -> list[str]:
    """Every sandbox.exec from here on (each a bubblewrap start on a local sandbox)."""
    calls: list[str] = []
    real = sandbox.exec

    async def counted(cmd, **kw):
        calls.append(cmd if isinstance(cmd, str) else " ".join(cmd))
        return await real(cmd, **kw)

    sandbox.exec = counted
    return calls


@pytest.fixture
def counted_grade(runtime, new_sandbox, monkeypatch):
    """grade() that returns (report, the execs after the workspace was prepared); the write
    calls after it in ``run.writes``."""
    after: list[list[str]] = []
    writes: list[list[list[str]]] = []
    real_prepare = prepare_workspace

    async def prepare(sandbox, *a, **kw):
        ws = await real_prepare(sandbox, *a, **kw)
        after.append(_count_execs(sandbox))  # the grading steps start here
        writes.append(_count_writes(sandbox))
        return ws

    monkeypatch.setattr(grader_module, "prepare_workspace", prepare)

    async def run(task, patch):
        after.clear()
        writes.clear()
        report = await grade(task, patch, runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(task)))
        run.writes = writes[0]
        return report, after[0]

    return run


async def test_a_grade_is_one_jailed_script_then_the_test_command(tasks_cfg, counted_grade) -> None:
    # the task's pytest takes seconds and is not what is counted here: a command that reports nothing
    task = load_tasks(tasks_cfg).by_id()["demo-wordfreq"].model_copy(update={"test_command": "echo no tests"})
    report, execs = await counted_grade(task, task.gold_patch)
    # the steps (reset, git apply, test patch, stale .pyc, probe chmod), then the tests
    assert len(execs) == 2, execs
    assert "farm-step-" in execs[0] and execs[1].endswith("echo no tests")
    # the files go in from outside in two calls: the probe's directory, then the steps' files
    probe_files, step_files = counted_grade.writes
    assert any(p.endswith("/key") for p in probe_files) and any(p.endswith("/config.json") for p in probe_files)
    assert sorted(p.rsplit("/", 1)[1] for p in step_files) == ["model.diff", "model.paths", "test.diff", "test.paths"]
    assert report.patch.strategy == "git_apply" and [a.command for a in report.patch.attempts] == ["git_apply"]
    assert report.status is GradeStatus.UNRESOLVED and "FAIL_TO_PASS not passing" in report.reason
    assert report.test_surface == {} and report.test.stdout_tail == "no tests\n"


async def test_a_failing_step_is_still_reported_precisely(tasks_cfg, counted_grade) -> None:
    task = load_tasks(tasks_cfg).by_id()["demo-wordfreq"]
    garbage = "diff --git a/wordfreq.py b/wordfreq.py\n--- a/wordfreq.py\n+++ b/wordfreq.py\n@@ -1 +1 @@\n-no such line\n+nope\n"
    report, execs = await counted_grade(task, garbage)
    assert len(execs) == 1  # the script stopped at the diff: no test command
    assert report.status is GradeStatus.PATCH_FAILED and report.test is None
    attempts = report.patch.attempts
    assert [a.command for a in attempts] == ["git_apply", "git_apply_3way", "patch_fuzz"]
    assert all(a.exit_code not in (0, None) for a in attempts)
    assert "patch failed: wordfreq.py:1" in attempts[0].stderr_tail  # git apply's own words, for its own step
    assert "error: wordfreq.py: patch does not apply" in attempts[1].stderr_tail
    assert attempts[2].exit_code == 1 and not attempts[2].stdout_tail  # its dry run's output goes to /dev/null
    assert report.reason == "the diff does not apply (git apply, --3way, patch --fuzz): "
    # the task's own test patch failing is the task's error, named as such
    bad_tp = task.model_copy(update={"test_patch": "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"})
    report, execs = await counted_grade(bad_tp, task.gold_patch)
    assert len(execs) == 1 and report.status is GradeStatus.ERROR
    assert report.reason == "the task's test patch does not apply: "  # patch --fuzz's, the last attempt's, words
    assert report.patch.strategy == "git_apply"  # the model's diff applied before
