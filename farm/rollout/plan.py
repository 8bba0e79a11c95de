"""What a run plans to run: its rollouts, minus those already done. (Where each runs is
``farm.actors.pool``; whether it runs again, ``farm.rollout.retry``.)"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from farm.rollout.model import RolloutSpec
from farm.tasks.model import Task


def expand_rollouts(
    run_id: str,
    tasks: Iterable[Task],
    n_samples: int,
    *,
    done: Collection[str] = (),
    limit: int | None = None,
) -> list[RolloutSpec]:
    """``n_samples`` rollouts per task (one group per task), minus those already ``done``.

    ``limit`` caps the plan *before* skipping done ones, so a resumed smoke run plans
    the same rollouts as the first one.
    """
    from farm.rollout.stream import TaskStream

    return TaskStream(run_id, list(tasks), n_samples, done=done).plan(limit)
