"""Rollouts out at sandbox actors, sent in batches: one actor call carries every rollout a
dispatch pass gives that actor (``SandboxActor.run_many``), and streams each one's answer
back as it finishes (several per message when they finish together).

Per-rollout bookkeeping stays per rollout (its actor, when it went out, the weights it went
out under): a rollout is handed back, guarded, aborted or re-dispatched on its own, whatever
batch it went in. A batch is only how its rollouts travel: ``InFlight`` knows which of a
batch's rollouts are still out, so that when a batch's stream ends early (its actor died,
it was cancelled) exactly those are dealt with. No Ray here: the dispatcher keeps the refs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutSpec

# At most this many rollouts in one actor call: bounds one call's payload (specs carry their
# task) and what one lost call takes with it. A dispatch pass rarely fills it but at start.
MAX_BATCH = 64

CANCELLED = "cancelled"  # Answer.error of a rollout cancelled in the actor (abort, stop): not a result


@dataclass(frozen=True)
class Answer:
    """What a sandbox actor hands back for one rollout of a batch: its summary (what
    ``SandboxActor.run`` returns), or why there is none: ``CANCELLED``, or what ``run`` raised
    (a bug in the actor: every rollout error is mapped to a status below it)."""

    rollout_id: str
    summary: RolloutSummary | None = None
    error: str = ""


@dataclass
class Sent:
    """One rollout out at an actor."""

    spec: RolloutSpec
    actor: str
    started: float
    version: int = 0  # the farm's weight version when it was dispatched
    batch: Any = None  # the call (its answer stream) it went out in


class InFlight:
    """The rollouts out at actors, by rollout id, and each batch's rollouts still out."""

    def __init__(self) -> None:
        self._rollouts: dict[str, Sent] = {}
        self._batches: dict[Any, set[str]] = {}

    def sent(self, batch: Any, items: list[Sent]) -> None:
        """``items`` went out together in ``batch``."""
        ids = self._batches.setdefault(batch, set())
        for item in items:
            item.batch = batch
            self._rollouts[item.spec.rollout_id] = item
            ids.add(item.spec.rollout_id)

    def back(self, rollout_id: str) -> Sent | None:
        """Take a rollout off (its answer came, or the dispatcher gave up on it); None when
        it is no longer out (an answer for a rollout the guard already ended)."""
        item = self._rollouts.pop(rollout_id, None)
        if item is not None:
            self._batches.get(item.batch, set()).discard(rollout_id)
        return item

    def started(self, batch: Any) -> float | None:
        """When ``batch`` went out (its rollouts went together); None when none is out."""
        ids = self._batches.get(batch)
        return self._rollouts[next(iter(ids))].started if ids else None

    def empty(self, batch: Any) -> bool:
        return not self._batches.get(batch)

    def drop(self, batch: Any) -> list[Sent]:
        """Forget ``batch`` (its stream ended or is abandoned); returns and takes off its
        rollouts still out."""
        return [item for item in (self.back(rid) for rid in sorted(self._batches.pop(batch, ()))) if item]

    @property
    def batches(self) -> list[Any]:
        return list(self._batches)

    def __len__(self) -> int:
        return len(self._rollouts)

    def __bool__(self) -> bool:
        return bool(self._rollouts)

    def __iter__(self) -> Iterator[Sent]:
        return iter(list(self._rollouts.values()))
