"""What the dispatch loop (``farm.actors.dispatch``) talks to: where groups come from in
a run, where finished rollouts are counted, what it reports progress to. The run
session provides them (``farm.run``); the loop knows only these shapes."""

from __future__ import annotations

from typing import Protocol

from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutSpec


class Feed(Protocol):
    """Where groups come from, pulled while the actors have free slots
    (farm.run.stream.StreamFeed). ``total``: the rollouts it hands out in all when known
    up front (a finite run: the progress display was told), else None (each group pulled
    grows the display's total)."""

    exhausted: bool
    total: int | None

    def next(self) -> list[RolloutSpec] | None: ...


class Tally(Protocol):
    """Where finished rollouts are counted (farm.run.summary.SummaryTally: bounded memory)."""

    count: int

    def add(self, summary: RolloutSummary) -> None: ...


class Progress(Protocol):
    """What the loop reports to (farm.run.progress.RunProgress)."""

    def note(self, message: str) -> None: ...

    def grow(self, n: int) -> None: ...

    def advance(self, summary: RolloutSummary, in_flight: int) -> None: ...
