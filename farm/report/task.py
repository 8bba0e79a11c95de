"""What was the task? A rollout's task, for ``farm inspect`` and the report.

Read from the rollout's artifacts (``task.json``: the Task it was given, inline tasks
included), else looked up by task id in the run's task file (``run_config.yaml``'s
``tasks.path``: runs from before task.json, or with ``artifacts.enabled: false``); the
file is loaded once, without recipes or machine checks (only the instruction and the
source are wanted). ``task_view`` is what is shown: id, kind, where the workspace comes
from (repository @ base commit, tarball, image), the instruction whole, the tests.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from farm.output.artifacts import read_task

log = logging.getLogger(__name__)


def source_of(workspace: dict[str, Any] | None) -> str:
    """``owner/repo @ base_commit``, ``tarball <path>``, ``image <name>``, or ``empty directory``."""
    if not workspace:
        return "empty directory (git-initialised)"
    kind = workspace.get("type")
    if kind == "git":
        where = workspace.get("repo") or workspace.get("url") or "?"
        return f"{where} @ {workspace.get('base_commit')}"
    if kind == "tarball":
        return f"tarball {workspace.get('path')}"
    if kind == "image":
        commit = workspace.get("base_commit")
        return f"image {workspace.get('image')}" + (f" @ {commit}" if commit else "")
    return str(workspace)


def task_view(task: dict[str, Any], origin: str) -> dict[str, Any]:
    """The parts of a task a person asks for first; ``origin`` says where it was read."""
    f2p, p2p = task.get("fail_to_pass") or [], task.get("pass_to_pass") or []
    tests = f"{len(f2p)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS" if f2p or p2p else ""
    if task.get("expected_test_statuses"):
        tests = f"{len(task['expected_test_statuses'])} tests with expected statuses"
    if not tests and task.get("verify_commands"):
        tests = f"{len(task['verify_commands'])} verify command(s)"
    swe = bool(f2p or p2p or task.get("test_patch") or task.get("expected_test_statuses"))
    return {
        "id": task.get("id", ""), "kind": "swe" if swe else "generic", "source": source_of(task.get("workspace")),
        "image": task.get("image") or "", "instruction": task.get("instruction", ""),
        "test_command": task.get("test_command") or "", "tests": tests, "origin": origin,
    }  # fmt: skip


class TaskLookup:
    """Tasks of one output directory, by rollout (artifacts first, then the task file)."""

    def __init__(self, out: Path, run_config: dict[str, Any]) -> None:
        self.out = out
        tasks = run_config.get("tasks") or {}
        self.tasks_path = str(tasks.get("path") or "")
        self.cache_dir = tasks.get("cache_dir")  # where `demo` is generated
        self._file: dict[str, dict[str, Any]] | None = None
        self.file_error = ""

    def _from_file(self, task_id: str) -> dict[str, Any] | None:
        if self._file is None:
            self._file = {}
            if self.tasks_path:
                try:
                    # the task loaders, only when a page shows a task's text
                    from farm.tasks.config import TasksConfig
                    from farm.tasks.loaders import load_tasks

                    where = {"cache_dir": self.cache_dir} if self.cache_dir else {}
                    loaded = load_tasks(TasksConfig(path=self.tasks_path, **where), recipes=None,
                                        check_requirements=False, environments=False)  # fmt: skip
                    self._file = {t.id: t.model_dump(mode="json") for t in loaded.tasks}
                except Exception as exc:  # noqa: BLE001 - a view: say it is missing, show the rest
                    self.file_error = f"{type(exc).__name__}: {exc}"
                    log.warning("task file %s not readable: %s", self.tasks_path, exc)
        return self._file.get(task_id)

    def get(self, rollout_id: str, task_id: str) -> dict[str, Any] | None:
        """The rollout's task view, or None when neither its artifacts nor the task file has it."""
        task = read_task(self.out, rollout_id)
        if task is not None:
            return task_view(task, "the rollout's artifacts (task.json)")
        task = self._from_file(task_id)
        if task is not None:
            return task_view(task, f"the run's task file {self.tasks_path} (looked up by id: it may have changed)")
        return None
