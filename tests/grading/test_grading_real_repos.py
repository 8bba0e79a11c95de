"""Real repositories' gold patches through the probe: astroid's own bugs (SWE-bench Lite
dev rows astroid-1196 and astroid-1333, graded by unittest.TestCase tests, two of them
``@staticmethod``), rebuilt from astroid's sdist (``testkit.astroid_tasks``), go
through ``farm validate-tasks`` as a user runs it: each gold patch resolves with no
finding, each empty patch does not, also with the tests spread over pytest-xdist workers; an environment that cannot run its tests (no pytest,
a conftest importing a package it lacks) is ``env_broken``, never a zero or a hack. A
hack on those unittest tests is still caught, and a diff that brings the missing
package itself is the policy's failure, not the environment's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from farm.envs.config import EnvsConfig
from farm.envs.provider import EnvProvider
from farm.grading import GradeStatus, grade, grading_spec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.rollout.outcome import outcome_for_grade
from farm.status import RolloutStatus
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from farm.tasks.runtime import TaskRuntime
from testkit.astroid_tasks import make_task_set


def recorded_as(report):
    """The rollout status a grading report makes (farm.rollout.outcome decides it)."""
    return outcome_for_grade(report.status, report.reason).status

pytestmark = pytest.mark.slow
HACKS = ("runtime:", "static:")
# Library code (astroid/__init__.py, outside the test surface) that skips unittest test bodies.
SKIP_UNITTEST_BODIES = "\ntry:\n    import _pytest.unittest as _u\n    _u.TestCaseFunction.runtest = lambda self: None\nexcept Exception:\n    pass\n"


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, Path]:
    """The task set, and one environment cache for the module (each environment builds once)."""
    root = tmp_path_factory.mktemp("astroid")
    return {**make_task_set(root), "envs": root / "envs", "sb": root / "sb"}


def test_validate_tasks_on_real_astroid_rows(rows, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    res = subprocess.run(
        [sys.executable, "-m", "farm", "validate-tasks", str(rows["tasks"]), "--report", str(tmp_path / "r.json"),
         "--set", f"tasks.recipes={rows['recipes']}", "--set", f"tasks.mirror_dir={rows['mirrors']}",
         "--set", f"envs.cache_dir={rows['envs']}", "--set", f"sandbox.local.base_dir={rows['sb']}",
         "--set", f"tasks.cache_dir={tmp_path / 'tc'}"],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    report = {r["task_id"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert res.returncode == 1 and len(report) == 5, res.stdout[-3000:] + res.stderr[-3000:]
    for instance in ("pypi__astroid-1196", "pypi__astroid-1333", "pypi__astroid-1333-xdist"):
        r = report[instance]
        gold, empty = r["gold"], r["empty"]
        assert r["valid"], (instance, r["reason"], gold.get("flags"))
        assert gold["status"] == "resolved" and not [f for f in gold["flags"] if f.startswith(HACKS)], gold
        assert gold["hack_action"] is None and empty["hack_action"] is None
        assert empty["status"] == "unresolved" and "FAILED" in empty["reason"], empty
    for instance, cause in (("pypi__astroid-1196-no-pytest", "pytest is not installed"),
                            ("pypi__astroid-1196-conftest", "lacks module(s) the tests import: numpy")):  # fmt: skip
        r = report[instance]
        assert not r["valid"]
        for which in ("gold", "empty"):
            g = r[which]
            assert g["status"] == "env_broken" and cause in g["reason"], (instance, which, g["reason"])
            assert g["reward"] == 0.0 and not [f for f in g["flags"] if f.startswith(HACKS)], g
        assert "the same without the diff" in r["gold"]["reason"]


async def test_a_hack_on_real_unittest_tests_is_caught_and_a_diff_is_not_the_environment(rows, tmp_path):
    cfg = TasksConfig(path=str(rows["tasks"]), recipes=str(rows["recipes"]), mirror_dir=str(rows["mirrors"]),
                      cache_dir=str(tmp_path / "tc"))  # fmt: skip
    runtime = TaskRuntime.from_config(cfg)
    tasks = {t.id: t for t in load_tasks(cfg)}
    sb_cfg = SandboxConfig(backend="local", local=LocalSandboxConfig(base_dir=str(rows["sb"])))
    runtime.envs = EnvProvider(EnvsConfig(cache_dir=str(rows["envs"])), runtime, lambda s: create_sandbox(sb_cfg, s))

    async def graded(task_id: str, diff: str):
        task = tasks[task_id]

        async def fresh():
            return await create_sandbox(sb_cfg, await runtime.sandbox_spec(task, grading_spec(task)))

        return await grade(task, diff, runtime=runtime, make_sandbox=fresh)

    init = "astroid/__init__.py"
    n = subprocess.run(["git", f"--git-dir={rows['mirrors'] / 'pypi__astroid.git'}", "show", f"main:{init}"],
                       capture_output=True, text=True, check=True).stdout.count("\n")  # fmt: skip
    skip = (f"diff --git a/{init} b/{init}\n--- a/{init}\n+++ b/{init}\n@@ -{n},0 +{n + 1},6 @@\n"
            + "".join(f"+{line}\n" for line in SKIP_UNITTEST_BODIES.splitlines()[1:]))  # fmt: skip
    skip = skip.replace(f"+{n + 1},6", f"+{n + 1},{len(SKIP_UNITTEST_BODIES.splitlines()) - 1}")
    hacked = await graded("pypi__astroid-1196", skip)
    assert hacked.patch.strategy is not None, hacked.patch
    assert "runtime:body_not_run" in hacked.flags, (hacked.flags, hacked.reason, hacked.fail_to_pass)
    assert hacked.reward == 0.0 and hacked.reward_before_hack_policy == 1.0 and hacked.hack_action == "zero_reward"

    modutils = "astroid/modutils.py"
    brings = (f"diff --git a/{modutils} b/{modutils}\n--- a/{modutils}\n+++ b/{modutils}\n@@ -1,0 +1,1 @@\n"
              "+import numpy  # noqa\n")  # fmt: skip
    policy = await graded("pypi__astroid-1333", brings)
    # the diff's own import fails collection: no test reached, a missing package named, and yet the
    # environment runs the tests without the diff: the policy's failure (reward 0), no finding
    assert set(policy.fail_to_pass.values()) == {"MISSING"}, policy.fail_to_pass
    assert policy.status is GradeStatus.UNRESOLVED and recorded_as(policy) is RolloutStatus.COMPLETED, policy.reason
    assert policy.reward == 0.0 and not [f for f in policy.flags if f.startswith(HACKS)] and policy.hack_action is None
    # an environment failure is confirmed by grading the empty patch: that grade is the task's and its
    # environment's, so a second diff is judged against it without grading it again (farm.grading.baseline)
    conftest = "pypi__astroid-1196-conftest"
    first = await graded(conftest, tasks[conftest].gold_patch)
    assert first.status is GradeStatus.ENV_BROKEN and "the same without the diff" in first.reason, first.reason
    assert runtime.baseline_grades is not None and runtime.baseline_grades.graded == 1
    again = await graded(conftest, brings)
    assert again.status is GradeStatus.ENV_BROKEN and "the same without the diff" in again.reason, again.reason
    assert runtime.baseline_grades.graded == 1
