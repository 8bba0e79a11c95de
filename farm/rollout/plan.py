"""The driver's decisions as small pure functions: what to run, and where. (Whether a
rollout runs again is ``farm.rollout.retry``.) The Ray loop in ``farm.actors.dispatch`` carries them out."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

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


def pick_actor(inflight: Mapping[str, int], capacity: int, prefer: str | None = None) -> str | None:
    """``prefer`` when it has a free slot (the actor whose node already holds the task's
    environment snapshot: see farm.envs), else the least-loaded actor with a free slot
    (ties: first in order), or None (backpressure)."""
    if prefer is not None and inflight.get(prefer, capacity) < capacity:
        return prefer
    best: str | None = None
    for name, n in inflight.items():
        if n < capacity and (best is None or n < inflight[best]):
            best = name
    return best
