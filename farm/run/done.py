"""The rollouts a resumed run finds already durable, one bit each on the stream's groups.

A resume is handed every durable rollout id (``ReducerActor.done_ids``). Kept as a set of
strings, 10^6 of them cost the driver ~100 MB for the whole run (the set, and the ids
themselves). A stream's rollout id is ``<group id>.<sample index>`` and its group id is the
task's id (epoch 0) or ``<task id>@<epoch>`` (``farm.run.stream.group_id_of``), so a done
id is a bit in its group's mask, keyed by the task's own id string (already held by the
run's tasks) and the epoch: one dict entry a done group. Ids that no (task, epoch) of
these tasks makes (another task set's, a malformed one) are only counted: no group of this
stream is ever skipped for them, nor for a sample index past the group's size.

Exact, as the set was: an id is parsed the one way ``make_rollout_id`` and
``group_id_of`` write it (decimal numbers without leading zeros); when a task id itself
contains ``@<n>``, both readings are marked, as the set would have matched both groups.
"""

from __future__ import annotations

from collections.abc import Iterable

from farm.tasks.model import Task


def _number(text: str) -> int | None:
    """``text`` as ``str(int)`` writes a non-negative integer, or None."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    return int(text)


def _mark(masks: dict[str, int], task_id: str, bit: int) -> int:
    """Set ``bit`` in ``task_id``'s mask: 1 if it was not set yet, else 0."""
    old = masks.get(task_id, 0)
    masks[task_id] = old | bit
    return 0 if old & bit else 1


class DoneRollouts:
    """Which rollouts of a stream are durable already: ``mask(task_id, epoch)`` has bit ``i``
    set for sample ``i`` of that group; ``len()`` counts every id given once."""

    def __init__(self) -> None:
        self._masks: dict[int, dict[str, int]] = {}  # epoch -> {task id: done samples}
        self.placed = 0  # done ids that are some group of these tasks' (the others: ``outside``)
        self.bits = 0  # bits set: ``placed``, plus one more for each id two groups make (see above)
        self.outside = 0  # ids no group of these tasks makes (counted, not kept)

    @classmethod
    def of(cls, ids: Iterable[str], tasks: Iterable[Task], n_samples: int) -> DoneRollouts:
        """The done rollouts among ``ids`` (distinct, as the reducer gives them) for a stream
        over ``tasks`` with ``n_samples`` rollouts a group."""
        done = cls()
        known = {t.id: t.id for t in tasks}  # the parsed copy -> the task's own string
        samples = {str(i): 1 << i for i in range(n_samples)}  # a sample index as make_rollout_id writes it
        first = done._masks.setdefault(0, {})
        for rid in ids:
            gid, _, index = rid.rpartition(".")
            bit = samples.get(index)  # None: no dot, or no sample of this stream's spelling
            groups = fresh = 0  # groups of these tasks that make this id; of them, those not marked yet
            if bit is not None:
                task_id = known.get(gid)
                if task_id is not None:  # epoch 0: the group id is the task id
                    groups, fresh = 1, _mark(first, task_id, bit)
                if "@" in gid:  # a later epoch's: <task id>@<epoch>
                    base, _, epoch_text = gid.rpartition("@")
                    epoch = _number(epoch_text)
                    task_id = known.get(base) if epoch else None
                    if task_id is not None:
                        groups, fresh = groups + 1, fresh + _mark(done._masks.setdefault(epoch, {}), task_id, bit)
            if fresh:
                done.placed += 1
                done.bits += fresh
            elif not groups:
                done.outside += 1
        return done

    def mask(self, task_id: str, epoch: int) -> int:
        """The done samples of task ``task_id``'s group in ``epoch``, as bits."""
        masks = self._masks.get(epoch)
        return masks.get(task_id, 0) if masks else 0

    def __len__(self) -> int:
        return self.placed + self.outside
