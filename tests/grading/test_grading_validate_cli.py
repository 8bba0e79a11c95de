"""``farm validate-tasks`` end to end (a real subprocess, real local sandboxes, mirrors from config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.tasks.demo import ensure_demo_set
from farm.tasks.loaders import load_tasks


@pytest.mark.slow
def test_validate_tasks_cli(demo_cache: Path, tmp_path: Path) -> None:
    demo = ensure_demo_set(demo_cache)
    good = load_tasks(demo.tasks_path).by_id()["demo-lrucache"]
    bad = good.model_copy(update={"id": "bad-gold", "gold_patch": ""})  # gold does not resolve
    # a FAIL_TO_PASS id pytest never reports (a typo): MISSING, and the ids it did report that are close
    typo = good.model_copy(update={"id": "bad-id", "fail_to_pass": ["tests/test_lru.py::test_get_refresh"]})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in (good, bad, typo)) + '{"id": "x"}\n')
    report = tmp_path / "out" / "report.json"
    base = [
        sys.executable, "-m", "farm", "validate-tasks", str(path),
        "--set", f"tasks.mirror_dir={demo.mirror_dir}",
        "--set", f"tasks.cache_dir={tmp_path / 'cache'}",
        "--set", f"sandbox.local.base_dir={tmp_path / 'sandboxes'}",
        "--report", str(report),
    ]
    wide = {**os.environ, "COLUMNS": "400"}  # the table's cells on one line each
    res = subprocess.run(base, capture_output=True, text=True, timeout=600, env=wide)
    assert res.returncode == 1, res.stderr
    data = json.loads(report.read_text())
    assert (data["total"], data["valid"], data["invalid"]) == (3, 1, 2)
    assert len(data["load_errors"]) == 1 and ":4: field 'instruction'" in data["load_errors"][0]
    by_id = {r["task_id"]: r for r in data["results"]}
    assert by_id["demo-lrucache"]["valid"] and by_id["demo-lrucache"]["gold"]["status"] == "resolved"
    assert not by_id["bad-gold"]["valid"] and "gold patch does not resolve" in by_id["bad-gold"]["reason"]
    assert "farm validate-tasks" in res.stderr and "INVALID" in res.stderr  # the table and progress lines
    assert ("tests/test_lru.py::test_get_refresh: MISSING (the run reported 4 tests; closest: "
            "tests/test_lru.py::test_get_refreshes)") in by_id["bad-id"]["reason"], by_id["bad-id"]["reason"]
    assert "closest: tests/test_lru.py::test_get_refreshes)" in res.stderr  # in the table's reason too

    ok = subprocess.run([*base, "--only", "demo-lrucache", "--strict"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 2 and "instruction" in ok.stderr  # strict: the malformed row stops it
    path.write_text(good.model_dump_json() + "\n")
    ok = subprocess.run(base, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(report.read_text())["valid"] == 1
    assert not any((tmp_path / "sandboxes").rglob("labels.json"))  # every sandbox was closed


def test_the_report_holds_reasons_whole(tmp_path: Path) -> None:
    """The console cuts a long reason (and says so); the JSON report keeps every character."""
    from farm.commands.validate_tasks import build_report, short
    from farm.errors import TaskLoadError
    from farm.grading.validate import TaskValidation
    from farm.tasks.loaders import TaskLoadResult

    reason = "gold patch does not resolve (unresolved: 3/3 FAIL_TO_PASS not passing (e.g. " + "t::x[a" * 80 + ")"
    results = [TaskValidation(task_id="t1", kind="swe", valid=False, reason=reason)]
    loaded = TaskLoadResult(path="x.jsonl", errors=[TaskLoadError("x.jsonl", 3, "log_parser", "unknown " + "y" * 400)])
    report = json.loads(json.dumps(build_report(loaded, results, 1.0)))
    assert report["results"][0]["reason"] == reason and len(reason) > 500
    assert report["load_errors"][0].endswith("y" * 400)
    cut = short(reason, 160)
    assert cut.startswith(reason[:160]) and f"[{len(reason) - 160} more characters in the report]" in cut
    assert short("fine", 160) == "fine"


def test_a_flagged_gold_patch_is_named_in_a_valid_tasks_reason() -> None:
    """A finding the policy only flags leaves the gold patch resolved: the task is valid, and
    the reason says what it was flagged for (every honest patch like it would be too)."""
    from farm.grading.report import GradeStatus, GradingReport
    from farm.grading.validate import verdict

    def report(resolved: bool, flags: list[str] = [], action: str | None = None) -> GradingReport:  # noqa: B006
        status = GradeStatus.RESOLVED if resolved else GradeStatus.UNRESOLVED
        return GradingReport(task_id="t", kind="swe", status=status, resolved=resolved, flags=flags, hack_action=action)

    assert verdict(report(True, ["diff_touches_tests"]), report(False)) == (True, "")  # not a hack finding
    valid, reason = verdict(report(True, ["static:sys_modules"], "flag"), report(False))
    assert valid and reason == "valid, but the gold patch has hack findings (flag): static:sys_modules"
    valid, reason = verdict(report(False, ["runtime:body_not_run"], "zero_reward"), report(True))
    assert not valid and reason.startswith("gold patch does not resolve") and "empty patch resolves" in reason
    # which tests pass without the diff: what a user looks at first (psf__requests-863, -1724)
    empty = report(True).model_copy(update={"fail_to_pass": {f"t.py::test_{i}": "PASSED" for i in range(4)}})
    assert verdict(report(True), empty) == (False, "the empty patch resolves (its FAIL_TO_PASS pass without the diff "
                                                   "here: t.py::test_0, t.py::test_1, t.py::test_2, ...)")


def test_validate_tasks_ends_when_a_repository_is_missing(tmp_path: Path) -> None:
    """A row whose repository cannot be found (no mirror; its clone refused at once) is
    INVALID with that reason, and the command still ends: the report written, exit 1. (The
    gold and empty gradings ask for the repository together: the one left cloning when the
    other failed was cancelled as the loop closed, mid-spawn, and never ended.)"""
    row = {
        "instance_id": "getmoto__moto-5000", "repo": "getmoto/moto", "repo_url": "http://127.0.0.1:9/moto.git",
        "base_commit": "0123456789abcdef0123456789abcdef01234567", "problem_statement": "fix it",
        "patch": "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-a\n+b\n",
        "test_patch": "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-a\n+b\n",
        "FAIL_TO_PASS": '["t.py::test_a"]', "PASS_TO_PASS": "[]", "setup_commands": ["true"],
    }  # fmt: skip
    path = tmp_path / "moto.jsonl"
    path.write_text(json.dumps(row) + "\n")
    report = tmp_path / "report.json"
    cmd = [
        sys.executable, "-m", "farm", "validate-tasks", str(path), "--report", str(report),
        "--set", f"tasks.mirror_dir={tmp_path / 'mirrors'}", "--set", f"tasks.cache_dir={tmp_path / 'cache'}",
        "--set", "tasks.fetch=true", "--set", f"envs.cache_dir={tmp_path / 'envs'}",
    ]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    data = json.loads(report.read_text())
    assert (data["total"], data["invalid"]) == (1, 1)
    reason = data["results"][0]["reason"]
    assert "repository getmoto/moto not found" in reason and "cloning http://127.0.0.1:9/moto.git failed" in reason
