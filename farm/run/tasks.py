"""The run's task list, from ``tasks.*`` of the config (through ``farm.tasks``' loaders)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from farm.config import FarmConfig
from farm.errors import TaskError
from farm.tasks.model import Task
from farm.grading.parsers import check_log_parser

if TYPE_CHECKING:
    from farm.tasks.loaders import TaskLoadResult

log = logging.getLogger(__name__)
MAX_LISTED = 50  # problems listed in the error of a file without one valid task


def load_task_file(cfg: FarmConfig) -> "TaskLoadResult":
    """The tasks of ``tasks.path``, each row also checked against what grading needs (a
    ``log_parser`` farm reads): a row it cannot grade is a load error, not a grading one; and
    against what the sandboxes can stand on (a dataset row needs an environment: on E2B the
    image SWE-bench names by instance id is one, since templates are built from it)."""
    # the task loaders (and their sources) load only when tasks are read
    from farm.tasks.loaders import load_tasks

    return load_tasks(cfg.tasks, check=check_log_parser, convention_images=cfg.sandbox.backend == "e2b")


def load_run_tasks(cfg: FarmConfig) -> list[Task]:
    """Every valid task (bad rows are logged and skipped unless ``tasks.strict``)."""
    result = load_task_file(cfg)
    for err in result.errors:
        log.warning("skipping task: %s", err)
    if not result.tasks:
        shown = "".join(f"\n  {e}" for e in result.errors[:MAX_LISTED])
        more = f"\n  ... and {len(result.errors) - MAX_LISTED} more" if len(result.errors) > MAX_LISTED else ""
        raise TaskError(f"no valid task in {result.path} ({len(result.errors)} problem(s)):{shown}{more}")
    return list(result.tasks)
