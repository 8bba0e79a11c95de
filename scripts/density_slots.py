"""Slots for ``bench_density.py``: rollouts run back to back in each, how busy they kept the slots,
and the most slots kept busy (``narrow``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any


def overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def slots(n: int, duration: float, one: Any, stagger: float = 0.0) -> tuple[list[dict[str, Any]], float, float]:
    """``n`` slots calling ``one(i, k, phases)`` back to back until the deadline; each record
    holds start, end and the phase marks [(name, t)] the rollout reported. Slot ``i`` starts
    ``stagger`` x i / n seconds after the first, and the window (t0, t1) opens when the last
    one has started and lasts ``duration``: with ``stagger`` a rollout's length, the slots are
    spread over a rollout as a long run's are (rollouts of different lengths drift apart);
    started together, they end together, and every rollout's capture, grading and test
    command meet the others' on the node's cores at once, round after round."""
    records: list[dict[str, Any]] = []
    first = time.monotonic()  # slot 0's start; the last slot's is the window's
    t0 = first + stagger * (n - 1) / max(1, n)
    deadline = t0 + duration

    async def slot(i: int) -> None:
        k = 0
        await asyncio.sleep(stagger * i / max(1, n))
        while time.monotonic() < deadline:
            phases: list[tuple[str, float]] = []
            start = time.monotonic()
            result = await one(i, k, phases)
            records.append({"start": start, "end": time.monotonic(), "phases": phases, "result": result})
            k += 1

    await asyncio.gather(*(slot(i) for i in range(n)))
    return records, t0, deadline


def finished_per_min(records: list[dict[str, Any]], t0: float, t1: float) -> float:
    """Rollouts delivered per minute over [t0, t1], each counted by the share of its run that
    lies in the window (a whole count would step with the rounds: 120 s hold two of 50 s or
    three of 40 s). Slot utilization counts an agent phase as busy however long contention
    stretches it; here a stretched rollout is a smaller share a second."""
    done = sum(overlap(r["start"], r["end"], t0, t1) / (r["end"] - r["start"]) for r in records if r["end"] > r["start"])
    return round(60.0 * done / (t1 - t0), 1)


def occupancy(records: list[dict[str, Any]], n: int, t0: float, t1: float) -> tuple[float, float]:
    """(rollouts in flight, slot utilization) over [t0, t1]: agent phases count as busy."""
    window = t1 - t0
    running = sum(overlap(r["start"], r["end"], t0, t1) for r in records)
    busy = 0.0
    for r in records:
        marks = r["phases"] + [("end", r["end"])]
        for (name, a), (_, b) in zip(marks, marks[1:]):
            if name == "agent":
                busy += overlap(a, b, t0, t1)
    return round(running / window, 1), round(busy / (n * window), 3)


async def narrow(capacity: dict[str, int], failed: dict[str, int], resolution: int,
                 busy: Callable[[str, int], Awaitable[bool]]) -> None:
    """Between each one's last slot count kept busy (``capacity``, 0: none) and its first not
    (``failed``), halve the gap down to ``resolution`` slots: ``busy(who, n)`` runs ``who`` at
    ``n`` slots. Turn about (each one's run beside the other's, as the steps were); updates both
    dicts in place. Stepping by 8 left the ratio of two capacities a quarter apart per step."""
    while wide := [w for w in failed if failed[w] - capacity.get(w, 0) > resolution > 0]:
        for who in wide:
            mid = (capacity.get(who, 0) + failed[who]) // 2
            if await busy(who, mid):
                capacity[who] = mid
            else:
                failed[who] = mid
