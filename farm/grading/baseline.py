"""The empty patch's grade: once per task and environment in a process, not once per rollout.

Two checks grade a task without the diff, in a fresh sandbox: an environment failure seen with
the diff applied is confirmed there (``farm.grading.environment``), and PASS_TO_PASS tests that
fail reaching the internet are left out only if they fail there too (``grader._offline_p2p``).
That grade belongs to the task and its environment, not to the rollout: every rollout of the
task in the same environment would grade the same empty patch again (a sandbox, the workspace,
the whole test command). So it is graded once and shared, also by rollouts that ask at the same
time (one grade in flight per key).

The key is the task's whole definition (its tests, test patch, test command, environment
variables...), the environment snapshot the grading sandbox starts from (its content key: a
rebuilt environment is another key) and the grading policy: an edited task, another environment
or another policy never reuses a grade. A sandbox that starts from no snapshot (it sets itself up
each time) has no such identity: its baseline is graded every time. A grade that raised is not
kept: the next rollout asks again.

The grades live in the process's ``TaskRuntime`` (``baselines_of``): it is what every grade is
given and it lives as long as the process's tasks do.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from farm.grading.config import GradingConfig
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime

MAX_ENTRIES = 512  # tasks x environments one process grades; the oldest go first


class BaselineGrades:
    """Empty-patch grades by key, each graded at most once at a time."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._done: OrderedDict[str, Any] = OrderedDict()
        self._running: dict[str, asyncio.Future[Any]] = {}
        self.graded = 0  # baselines actually graded (the rest were shared)

    async def get(self, key: str | None, make: Callable[[], Awaitable[Any]]) -> Any:
        """The grade for ``key``, from ``make()`` the first time (``key`` None: always ``make()``)."""
        if key is None:
            self.graded += 1
            return await make()
        if key in self._done:
            self._done.move_to_end(key)
            return self._done[key]
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(self._grade(key, make))
            self._running[key] = running
        return await asyncio.shield(running)  # one rollout cancelled does not cancel the others' grade

    async def _grade(self, key: str, make: Callable[[], Awaitable[Any]]) -> Any:
        try:
            self.graded += 1
            report = await make()
        finally:
            self._running.pop(key, None)
        self._done[key] = report
        while len(self._done) > self.max_entries:
            self._done.popitem(last=False)
        return report


def baseline_key(task: Task, environment: str | None, policy: GradingConfig) -> str | None:
    """The key of ``task``'s empty-patch grade in ``environment`` (a snapshot's content key)
    under ``policy``; None when the environment has no identity (nothing to share)."""
    if not environment:
        return None
    h = hashlib.sha256()
    for part in (task.model_dump_json(), environment, policy.model_dump_json()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def baselines_of(runtime: TaskRuntime) -> BaselineGrades:
    """The process's baseline grades (made on first use)."""
    if runtime.baseline_grades is None:
        runtime.baseline_grades = BaselineGrades()
    return runtime.baseline_grades
