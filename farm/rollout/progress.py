"""The driver's progress display: a rich bar on a terminal, one line per rollout in a
job log (``ray job logs`` is not a terminal)."""

from __future__ import annotations

import time
from collections import Counter

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from farm.rollout.model import RolloutSummary


class RunProgress:
    def __init__(self, console: Console, total: int, *, run_id: str) -> None:
        self.console = console
        self.total = total
        self.done = 0
        self.by_status: Counter[str] = Counter()
        self.t0 = time.monotonic()
        self._bar: Progress | None = None
        self._task = None
        if console.is_terminal:
            self._bar = Progress(
                TextColumn(f"[bold]farm {run_id}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[statuses]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task("rollouts", total=total, statuses="")
            self._bar.start()
        else:
            what = f"{total} rollouts to run" if total else "continuous: groups are pulled as the trainer consumes them"
            console.print(f"farm {run_id}: {what}", highlight=False, soft_wrap=True)

    def _statuses(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.by_status.items()))

    def advance(self, summary: RolloutSummary, in_flight: int) -> None:
        self.done += 1
        self.by_status[summary.status.value] += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, statuses=self._statuses())
            return
        elapsed = time.monotonic() - self.t0
        self.console.print(
            f"[{self.done}/{self.total}] {summary.rollout_id} {summary.status.value} "
            f"reward={summary.reward:g} turns={summary.turns} {summary.duration_s:.1f}s"
            f"{' (' + summary.reason[:120] + ')' if summary.reason else ''} | in flight {in_flight}, "
            f"{elapsed:.0f}s elapsed, {self._statuses()}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )

    def grow(self, n: int) -> None:
        """``n`` more rollouts planned (continuous mode pulls groups as it goes)."""
        self.total += n
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
