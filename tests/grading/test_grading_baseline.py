"""The empty patch's grade is shared per task, environment and policy (farm.grading.baseline):
graded once however many rollouts ask (also at once), never reused across tasks, environments
or policies, never kept when it raised. The grader's use of it on real sandboxes is in
test_grading_real_repos (an environment failure confirmed once for two gradings)."""

from __future__ import annotations

import asyncio

import pytest

from farm.grading.baseline import BaselineGrades, baseline_key, baselines_of
from farm.grading.config import GradingConfig
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from farm.tasks.runtime import TaskRuntime


@pytest.fixture
def task():
    return load_tasks(TasksConfig(path="demo")).by_id()["demo-durations"]


def test_the_key_names_the_task_the_environment_and_the_policy(task) -> None:
    policy = GradingConfig()
    key = baseline_key(task, "env-a", policy)
    assert key == baseline_key(task.model_copy(), "env-a", GradingConfig())
    assert key != baseline_key(task, "env-b", policy)  # another environment
    assert key != baseline_key(task.model_copy(update={"id": "other"}), "env-a", policy)  # another task
    edited = task.model_copy(update={"pass_to_pass": [*task.pass_to_pass, "tests/x.py::test_y"]})
    assert key != baseline_key(edited, "env-a", policy)  # the same task id, edited
    assert key != baseline_key(task, "env-a", GradingConfig(probe=False))  # another policy
    assert baseline_key(task, None, policy) is None  # no snapshot: no identity, nothing shared


async def test_one_grade_per_key_also_when_asked_at_once() -> None:
    grades, calls = BaselineGrades(), []

    async def make(tag: str):
        calls.append(tag)
        await asyncio.sleep(0.01)  # a grading that takes a while: concurrent callers overlap
        return f"report-{tag}"

    got = await asyncio.gather(*(grades.get("k1", lambda: make("a")) for _ in range(5)))
    assert got == ["report-a"] * 5 and calls == ["a"]
    assert await grades.get("k1", lambda: make("b")) == "report-a"  # kept
    assert await grades.get("k2", lambda: make("c")) == "report-c"  # another key: its own grade
    assert await grades.get(None, lambda: make("d")) == "report-d"  # no key: every time
    assert await grades.get(None, lambda: make("e")) == "report-e"
    assert calls == ["a", "c", "d", "e"] and grades.graded == 4


async def test_a_grade_that_raised_is_asked_again_and_the_oldest_go_first() -> None:
    grades = BaselineGrades(max_entries=2)

    async def fail():
        raise RuntimeError("sandbox backend down")

    with pytest.raises(RuntimeError):
        await grades.get("k", fail)

    async def ok(tag: str):
        return tag

    assert await grades.get("k", lambda: ok("x")) == "x"
    await grades.get("k2", lambda: ok("y"))
    await grades.get("k3", lambda: ok("z"))  # over max_entries: "k" goes
    assert await grades.get("k", lambda: ok("again")) == "again"


async def test_a_cancelled_asker_does_not_cancel_the_others_grade() -> None:
    grades = BaselineGrades()
    release = asyncio.Event()

    async def make():
        await release.wait()
        return "report"

    first = asyncio.ensure_future(grades.get("k", make))
    second = asyncio.ensure_future(grades.get("k", make))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == "report" and grades.graded == 1


def test_the_grades_live_in_the_runtime() -> None:
    runtime = TaskRuntime.from_config(TasksConfig(path="demo"))
    assert baselines_of(runtime) is baselines_of(runtime) is runtime.baseline_grades
