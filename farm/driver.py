"""Moved to ``farm.run.batch`` (issue 29: the run session, ``farm/run/``, starts every
run); ``farm.driver.run_farm`` keeps working for one release.

(The private helpers below serve ``farm.continuous`` and ``farm.single`` until they open a
run session too.)"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import ray
from rich.console import Console

from farm.actors.assembly import FarmActors
from farm.actors.dispatch import Dispatcher
from farm.config import FarmConfig
from farm.loggers import RunLoggers
from farm.run.batch import run_batch
from farm.run.batch import run_batch as run_farm
from farm.run.summary import RunSummary, summarize, summary_table, with_history, write_summary

__all__ = ["run_batch", "run_farm"]

warnings.warn("farm.driver moved to farm.run.batch (run_farm is run_batch)", DeprecationWarning, stacklevel=2)
log = logging.getLogger(__name__)


def _write_run_config(cfg: FarmConfig, out_dir: Path) -> None:
    """The resolved config next to the shards, once its task set is the one the directory
    holds (``farm.rollout.outdir``: another one is refused). Also farm.Farm's and farm.Rollouts'."""
    from farm.rollout.outdir import check_tasks_source, write_run_config

    check_tasks_source(cfg, out_dir)
    write_run_config(cfg, out_dir)


def _start_loggers(cfg: FarmConfig, console: Console, out_dir: Path) -> RunLoggers:
    """The configured run loggers, started (a failing one is reported and left out)."""
    note = lambda m: console.print(f"farm: {m}", highlight=False, markup=False, soft_wrap=True)  # noqa: E731
    loggers = RunLoggers.from_config(cfg.loggers, str(out_dir), note=note)
    loggers.start(cfg.run_id, cfg.model_dump(mode="json"))
    return loggers


def _fidelity(out_dir: Path) -> dict[str, Any] | None:
    """The output's token-fidelity totals (never fails the run's end)."""
    from farm.trajectory.fidelity import fidelity_report

    try:
        return fidelity_report(out_dir)[0]
    except Exception as exc:  # noqa: BLE001 - a summary field, not worth a failed run
        log.warning("token fidelity totals not computed: %s", exc)
        return None


def _finish(
    cfg: FarmConfig, console: Console, farm: FarmActors, dispatcher: Dispatcher | None, planned: int, skipped: int,
    t0: float, started_at: float, out_dir: Path, started_ray: bool, recovery: list[str],
    loggers: RunLoggers | None = None,
) -> RunSummary:
    """Stop everything the run started, write and print the summary."""
    try:
        farm.close()
    finally:
        summaries = list(dispatcher.summaries.values()) if dispatcher else []
        summary = summarize(
            cfg.run_id,
            summaries,
            planned=planned,
            skipped_done=skipped,
            wall_s=time.monotonic() - t0,
            redispatched=dispatcher.redispatched if dispatcher else 0,
            retried=dispatcher.retried if dispatcher else 0,
            interrupted=bool(dispatcher and dispatcher.interrupted),
        ).model_copy(update={"recovery": recovery, "lost_nodes": farm.lost_nodes})
        summary = with_history(summary, out_dir, started_at=started_at, group_size=cfg.rollout.n_samples)
        summary = summary.model_copy(update={"fidelity": _fidelity(out_dir)})
        write_summary(summary, out_dir)
        console.print(summary_table(summary))
        if loggers is not None:
            loggers.close(summary.model_dump(mode="json"))
        if started_ray:
            ray.shutdown()
    return summary
