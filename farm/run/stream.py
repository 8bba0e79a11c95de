"""The task stream of a run: groups of rollouts, epoch after epoch, in a seeded order.

``farm run`` on a finite stream (``stream.epochs`` = 1, the default) plans exactly what
it always planned: one group per task, in the task file's order, group ids = task
ids. More epochs, shuffling and a curriculum hook turn it into the source of a
training loop (``farm.Farm``), which pulls one group at a time under back-pressure.
Either way the dispatch loop pulls groups as its actors have room (``StreamFeed``): a
group's specs are made when it is pulled, never the run's whole list (10^6 rollouts'
specs cost a driver 2.2 GB); a finite run's counts are arithmetic (``TaskStream.count``).

Ids are stable across invocations (resume depends on it): epoch 0 keeps the task id
as its group id; epoch e > 0 uses ``<task id>@<e>``. ``group_index`` counts groups in
stream order from 0, so a reader can yield groups in task order. The order is a pure
function of (tasks, seed, epoch), so a resumed run replays it; a curriculum hook that
looks at rewards is the exception (it sees what the trainer saw).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
import threading

from farm.rollout.model import RolloutSpec, make_rollout_id
from farm.run.config import StreamConfig
from farm.run.done import DoneRollouts
from farm.tasks.model import Task

# (epoch, tasks, mean reward of each task's groups so far) -> the tasks of that epoch, in order
Curriculum = Callable[[int, list[Task], dict[str, list[float]]], Sequence[Task]]


def load_curriculum(spec: str) -> Curriculum:
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"stream.curriculum must be 'module:function', not {spec!r}")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"stream.curriculum: {spec!r} is not a callable")
    return fn


def group_id_of(task_id: str, epoch: int) -> str:
    return task_id if epoch == 0 else f"{task_id}@{epoch}"


class TaskStream:
    """Iterates groups (lists of ``RolloutSpec``) in stream order; ``group_index`` counts
    every group of the stream, including those skipped as already done."""

    def __init__(
        self,
        run_id: str,
        tasks: Sequence[Task],
        n_samples: int,
        cfg: StreamConfig | None = None,
        *,
        curriculum: Curriculum | None = None,
        done: DoneRollouts | Collection[str] = (),
    ) -> None:
        seen: set[str] = set()
        for task in tasks:
            if task.id in seen:
                raise ValueError(f"duplicate task id {task.id!r}")
            seen.add(task.id)
        self.run_id, self.tasks, self.n = run_id, list(tasks), n_samples
        self.cfg = cfg or StreamConfig()
        self.curriculum = curriculum or (load_curriculum(self.cfg.curriculum) if self.cfg.curriculum else None)
        # the durable ones, a bit each (a resumed session's, not copied; ids: made here)
        self.done = done if isinstance(done, DoneRollouts) else DoneRollouts.of(done, self.tasks, n_samples)
        self.rewards: dict[str, list[float]] = {}  # task id -> group mean rewards seen (the curriculum's input)

    @property
    def finite(self) -> bool:
        return self.cfg.epochs is not None

    def observe(self, task_id: str, reward_mean: float) -> None:
        """A finished group's mean reward (what a curriculum hook sees next epoch)."""
        self.rewards.setdefault(task_id, []).append(reward_mean)

    def epoch_tasks(self, epoch: int) -> list[Task]:
        tasks = list(self.tasks)
        if self.cfg.shuffle:
            random.Random(self.cfg.seed + epoch).shuffle(tasks)
        if self.curriculum is not None:
            tasks = list(self.curriculum(epoch, tasks, {k: list(v) for k, v in self.rewards.items()}))
        return tasks

    def _slots(self) -> Iterator[tuple[int, int, Task]]:
        """(group index, epoch, task) of every group in stream order: a group before any
        spec of it is made (an epoch's order is decided when the stream reaches it)."""
        index = 0
        epoch = 0
        while self.cfg.epochs is None or epoch < self.cfg.epochs:
            tasks = self.epoch_tasks(epoch)
            if not tasks:
                return
            for task in tasks:
                yield index, epoch, task
                index += 1
            epoch += 1

    def __iter__(self) -> Iterator[list[RolloutSpec]]:
        return self.groups()

    def groups(self, limit: int | None = None) -> Iterator[list[RolloutSpec]]:
        """The groups not done, in stream order, each made when it is pulled. ``limit`` caps
        the stream's rollouts counted with the done ones (a resumed smoke run plans the
        same rollouts); it may cut the last group short."""
        left = limit
        for index, epoch, task in self._slots():
            if left is not None and left <= 0:
                return
            size = self.n if left is None else min(self.n, left)
            if left is not None:
                left -= size
            gid = group_id_of(task.id, epoch)
            done = self.done.mask(task.id, epoch)
            todo = [
                RolloutSpec(run_id=self.run_id, rollout_id=make_rollout_id(gid, i), group_id=gid, sample_index=i,
                            group_index=index, epoch=epoch, task=task)
                for i in range(size) if not done >> i & 1
            ]  # fmt: skip
            if todo:
                yield todo

    def count(self, limit: int | None = None) -> tuple[int, int]:
        """(rollouts to run, rollouts skipped as done) of a finite stream capped at ``limit``,
        the counts ``plan(limit)`` has, without making a spec: what the progress display
        and the summary are told before the first group is pulled. Done ids outside the
        capped stream (another config's, or past the limit) are not skipped ones."""
        if not self.finite:
            raise ValueError("an endless stream (stream.epochs: null) has no plan: pull groups from it")
        assert self.cfg.epochs is not None
        if self.curriculum is None:
            total = len(self.tasks) * self.n * self.cfg.epochs
        else:  # a hook decides each epoch's tasks (an empty epoch ends the stream)
            total = 0
            for epoch in range(self.cfg.epochs):
                tasks = self.epoch_tasks(epoch)
                if not tasks:
                    break
                total += len(tasks) * self.n
        capped = total if limit is None else min(total, max(0, limit))
        skipped = position = 0
        if self.done.bits:  # where each done id falls: walk the groups (no spec made) until the cap
            for _, epoch, task in self._slots():
                if position >= capped or skipped == self.done.bits:
                    break
                size = min(self.n, capped - position)
                skipped += (self.done.mask(task.id, epoch) & ((1 << size) - 1)).bit_count()
                position += size
        return capped - skipped, skipped

    def plan(self, limit: int | None = None) -> list[RolloutSpec]:
        """Every rollout of a finite stream, as one list (``limit`` caps it before skipping
        done ones, so a resumed smoke run plans the same rollouts). ``farm run`` never
        makes this list: it pulls ``groups(limit)`` through a ``StreamFeed``."""
        if not self.finite:
            raise ValueError("an endless stream (stream.epochs: null) has no plan: pull groups from it")
        return [s for group in self.groups(limit) for s in group]


class StreamFeed:
    """The stream pulled group by group by the dispatch loop (while its actors have free
    slots), so no list of the run's rollouts is ever made.

    Continuous mode (``farm.Farm``) puts it under back-pressure released by the trainer:
    a group is handed out only while the rollouts dispatched and not yet consumed
    (``ahead``) stay within ``max_ahead`` (one group is always allowed, so a group larger
    than the bound still runs). ``farm run`` on a finite stream has none: ``limit``
    caps the stream (``TaskStream.groups``) and ``total`` is what it will hand out in
    all (``TaskStream.count``: the progress display knows it up front); None when that
    is not known (groups are counted as they are pulled). Thread-safe: the trainer's
    thread calls ``consumed``, the dispatcher's thread ``next``."""

    def __init__(self, stream: TaskStream, max_ahead: int | None = None, *, limit: int | None = None,
                 total: int | None = None) -> None:
        self._it = stream.groups(limit)
        self.total = total
        self._lock = threading.Lock()
        self.max_ahead = max_ahead
        self.ahead = 0
        self.dispatched_groups = 0
        self.exhausted = False

    def next(self) -> list[RolloutSpec] | None:
        """The next group, or None (back-pressure, or the stream ended: see ``exhausted``)."""
        with self._lock:
            if self.exhausted:
                return None
            if self.max_ahead is not None and self.ahead > 0 and self.ahead + 1 > self.max_ahead:
                return None
            group = next(self._it, None)
            if group is None:
                self.exhausted = True
                return None
            if self.max_ahead is not None and self.ahead > 0 and self.ahead + len(group) > self.max_ahead:
                self._it = _pushback(group, self._it)
                return None
            self.ahead += len(group)
            self.dispatched_groups += 1
            return group

    def consumed(self, rollouts: int) -> None:
        with self._lock:
            self.ahead = max(0, self.ahead - rollouts)

    def close(self) -> None:
        """No more groups (a draining stop)."""
        with self._lock:
            self.exhausted = True


def _pushback(first: list[RolloutSpec], rest: Iterator[list[RolloutSpec]]) -> Iterator[list[RolloutSpec]]:
    yield first
    yield from rest


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
    return TaskStream(run_id, list(tasks), n_samples, done=done).plan(limit)
