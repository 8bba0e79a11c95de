"""The driver's progress display: a rich bar on a terminal, one line per rollout in a
job log (``ray job logs`` is not a terminal) up to ``LINES_PER_S`` a second, past that one
line a second for the rollouts since; and the run's metrics as it goes, for the run
loggers (``farm.loggers``) when any is configured."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from farm.output.rows import RolloutSummary
from farm.run.summary import RESOLVED_REWARD

# A job log stays readable (and printing stays cheap) when rollouts end faster than this:
# the rollouts past it in a second are summed up in one line.
LINES_PER_S = 10


def shown_path(path: str) -> str:
    """``path`` relative to the working directory when it is under it (``runs/local``)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class RunProgress:
    def __init__(self, console: Console, total: int, *, run_id: str, out_dir: str | None = None,
                 loggers: Any = None) -> None:
        self.console = console
        self.total = total
        self.done = 0
        self.by_status: Counter[str] = Counter()
        self.loggers = loggers  # farm.loggers.RunLoggers, or None
        self.finished = 0  # not rerun (cancelled / interrupted): the reward mean's denominator
        self.reward_sum = 0.0
        self.resolved = 0
        self.output_tokens = 0
        self.in_flight = 0
        self.t0 = time.monotonic()
        self._second = self.t0  # the second the last lines went out in, and how many did
        self._lines = 0
        self._held: Counter[str] = Counter()  # rollouts past LINES_PER_S not printed yet, by status
        self._bar: Progress | None = None
        self._task = None
        what = f"{total} rollouts to run" if total else "continuous: groups are pulled as the trainer consumes them"
        where = f" into {shown_path(out_dir)}" if out_dir else ""
        # the run's id (what its sandboxes, actors and report are named by) and where it writes, first
        console.print(f"farm run {run_id}: {what}{where}", highlight=False, markup=False, soft_wrap=True)
        if console.is_terminal:
            self._bar = Progress(
                TextColumn(f"[bold]farm run {escape(run_id)}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[statuses]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self._task = self._bar.add_task("rollouts", total=total, statuses="")
            self._bar.start()

    def _statuses(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.by_status.items()))

    def advance(self, summary: RolloutSummary, in_flight: int) -> None:
        now = time.monotonic()
        if now - self._second >= 1.0:  # a new second: first what the last one held
            self._flush_held()
            self._second, self._lines = now, 0
        self.done += 1
        self.by_status[summary.status.value] += 1
        self.in_flight = in_flight
        self.output_tokens += summary.output_tokens
        if not summary.status.reruns:
            self.finished += 1
            self.reward_sum += summary.reward
            self.resolved += summary.reward >= RESOLVED_REWARD
        if self.loggers:
            self.loggers.log_metrics(self.metrics(), step=self.done)
        if self._bar is not None:
            self._bar.update(self._task, advance=1, statuses=self._statuses())
            return
        if self._lines >= LINES_PER_S:
            self._held[summary.status.value] += 1
            return
        self._lines += 1
        elapsed = now - self.t0
        self.console.print(
            f"[{self.done}/{self.total}] {summary.rollout_id} {summary.status.value} "
            f"reward={summary.reward:g} turns={summary.turns} {summary.duration_s:.1f}s"
            f"{' (' + summary.reason[:120] + ')' if summary.reason else ''} | in flight {in_flight}, "
            f"{elapsed:.0f}s elapsed, {self._statuses()}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )

    def _flush_held(self) -> None:
        if not self._held:
            return
        held = " ".join(f"{k}={v}" for k, v in sorted(self._held.items()))
        self.console.print(
            f"[{self.done}/{self.total}] {sum(self._held.values())} more rollouts ended ({held}) | in flight "
            f"{self.in_flight}, {time.monotonic() - self.t0:.0f}s elapsed, {self._statuses()}",
            highlight=False, markup=False, soft_wrap=True)  # fmt: skip
        self._held.clear()

    def metrics(self) -> dict[str, float]:
        """The run so far: counts by status, reward mean, throughput (what the loggers get)."""
        elapsed = max(1e-9, time.monotonic() - self.t0)
        out = {"rollouts/done": self.done, "rollouts/planned": self.total, "rollouts/in_flight": self.in_flight,
               "reward/mean": self.reward_sum / self.finished if self.finished else 0.0,
               "reward/resolved": self.resolved, "reward/resolved_rate": self.resolved / self.finished if self.finished else 0.0,
               "throughput/rollouts_per_min": 60.0 * self.done / elapsed,
               "throughput/output_tokens_per_s": self.output_tokens / elapsed,
               "tokens/output": self.output_tokens, "time/elapsed_s": elapsed}  # fmt: skip
        out.update({f"status/{k}": v for k, v in self.by_status.items()})
        return {k: float(v) for k, v in out.items()}

    def grow(self, n: int) -> None:
        """``n`` more rollouts planned (continuous mode pulls groups as it goes)."""
        self.total += n
        if self._bar is not None:
            self._bar.update(self._task, total=self.total)

    def note(self, message: str) -> None:
        self.console.print(message, highlight=False, markup=False, soft_wrap=True)

    def close(self) -> None:
        self._flush_held()
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
