"""Busy time: how long at least one rollout was running, the one base of farm's rates.

A run's ``wall_s`` is its command's start-up to exit (Ray, the engine, environment builds
and shutdown included; a resumed run counts only its own invocation). Busy time is the
union of the rollouts' own ``[started_at, finished_at]`` intervals: overlaps count once,
gaps (start-up, the day between a run and its resume, a ``farm serve`` waiting for
requests) not at all. Rollouts/min and tokens/s are over busy time wherever farm prints
them (the run summary, ``summary.json``, ``farm report``), so a run and its report agree.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable


class BusyTime:
    """The union of intervals, kept as disjoint sorted segments: one per stretch of
    rollouts without a gap (a run of 10^6 overlapping rollouts keeps a handful), added in
    any order."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []

    @classmethod
    def of(cls, intervals: Iterable[tuple[float, float]]) -> BusyTime:
        busy = cls()
        for a, b in intervals:
            busy.add(a, b)
        return busy

    def add(self, start: float, end: float) -> None:
        """One rollout's interval; ignored when it has no times (0: a row rebuilt from its
        Samples after a crash, an attempt stopped before it started) or ends before it starts."""
        if start <= 0 or end < start:
            return
        i = bisect.bisect_left(self._ends, start)  # the first segment that ends at or after start
        j = bisect.bisect_right(self._starts, end)  # segments [i, j) touch [start, end]
        if i < j:
            start, end = min(start, self._starts[i]), max(end, self._ends[j - 1])
        self._starts[i:j] = [start]
        self._ends[i:j] = [end]

    @property
    def seconds(self) -> float:
        return sum(b - a for a, b in zip(self._starts, self._ends))

    @property
    def span(self) -> float:
        """From the first start to the last end (gaps included)."""
        return self._ends[-1] - self._starts[0] if self._starts else 0.0

    def __len__(self) -> int:
        return len(self._starts)


def per_busy_minute(count: float, busy_s: float) -> float:
    return 60.0 * count / busy_s if busy_s > 0 else 0.0


def per_busy_second(count: float, busy_s: float) -> float:
    return count / busy_s if busy_s > 0 else 0.0
