"""The driver: assemble the farm on Ray (``farm.actors.assembly``: reducer, router, sandbox
actors), run the dispatch loop (``farm.actors.dispatch``), stop everything it started,
summarize.

``run_farm(cfg)`` is what ``farm run`` calls, locally or under ``ray job submit``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import ray
from rich.console import Console

from farm.actors.assembly import FarmActors, init_ray
from farm.actors.dispatch import CONTROL_TIMEOUT_S, Dispatcher
from farm.config import FarmConfig
from farm.loggers import RunLoggers
from farm.run.stream import StreamFeed, TaskStream
from farm.run.progress import RunProgress
from farm.run.lock import RunLock
from farm.run.signals import cleanup_phase, stop_signals
from farm.run.summary import RunSummary, SummaryTally, summary_table, with_history, write_summary
from farm.tasks.model import Task

log = logging.getLogger(__name__)

def _write_run_config(cfg: FarmConfig, out_dir: Path) -> None:
    """The resolved config next to the shards, once its task set is the one the directory
    holds (``farm.rollout.outdir``: another one is refused). Also farm.Farm's and farm.Rollouts'."""
    from farm.rollout.outdir import check_tasks_source, write_run_config

    check_tasks_source(cfg, out_dir)
    write_run_config(cfg, out_dir)


def run_farm(
    cfg: FarmConfig,
    *,
    console: Console | None = None,
    e2b_api_key: str | None = None,
    tasks: list[Task] | None = None,
    parts_factory: Any = None,
    endpoint_api_key: str | None = None,
) -> RunSummary:
    """Run every rollout of ``cfg`` not already in ``cfg.output.dir``; return the summary.

    ``endpoint_api_key``: the key of the hosted endpoint ``cfg.endpoint`` names (black-box
    runs; read from its ``api_key_env`` by the entry point, never written anywhere).

    ``tasks`` (default: loaded from ``cfg.tasks``) and ``parts_factory`` (default: the
    real layers, ``farm.rollout.parts.FarmParts``; a factory also means no engine is
    started) are seams for tests and embedding.
    """
    from farm.run.tasks import load_run_tasks

    console = console or Console()
    out_dir = Path(cfg.output.dir).expanduser().resolve()
    cfg = cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": str(out_dir)})})
    # One owner per run, FIRST: a second invocation fails here and touches nothing.
    with RunLock(out_dir, cfg.run_id):
        _write_run_config(cfg, out_dir)
        if tasks is None:
            tasks = load_run_tasks(cfg)
        started_ray = init_ray(cfg)
        with stop_signals():  # after ray.init, which installs its own SIGTERM handler
            return _run_owned(cfg, console, e2b_api_key, tasks, parts_factory, out_dir, started_ray,
                              endpoint_api_key)


def _run_owned(
    cfg: FarmConfig, console: Console, e2b_api_key: str | None, tasks: list[Task], parts_factory: Any,
    out_dir: Path, started_ray: bool, endpoint_api_key: str | None = None,
) -> RunSummary:
    started_at = time.time()
    farm = FarmActors(cfg, e2b_api_key=e2b_api_key, parts_factory=parts_factory, endpoint_api_key=endpoint_api_key)
    t0 = time.monotonic()
    dispatcher: Dispatcher | None = None
    planned = skipped = 0
    recovery: list[str] = []
    loggers = _start_loggers(cfg, console, out_dir)
    try:
        reducer = farm.start_reducer()
        recovery = ray.get(reducer.recovery.remote(), timeout=CONTROL_TIMEOUT_S)
        done = set(ray.get(reducer.done_ids.remote(), timeout=CONTROL_TIMEOUT_S))
        stream = TaskStream(cfg.run_id, tasks, cfg.rollout.n_samples, cfg.stream, done=done)
        feed = None
        if stream.finite:
            specs = stream.plan(cfg.rollout.limit)
            skipped = len(TaskStream(cfg.run_id, tasks, cfg.rollout.n_samples, cfg.stream).plan(cfg.rollout.limit))
            skipped -= len(specs)
        else:  # stream.epochs: null: groups are pulled until the run is stopped
            specs, skipped, feed = [], 0, StreamFeed(stream)
        planned = len(specs)
        progress = RunProgress(console, planned, run_id=cfg.run_id, loggers=loggers)
        if recovery:
            progress.note("recovered " + str(out_dir) + ": " + " | ".join(recovery))
        if skipped:
            progress.note(f"resuming: {skipped} rollouts already in {out_dir}, {planned} to run")
        try:
            if specs or feed is not None:
                if parts_factory is None and not cfg.black_box:  # a hosted endpoint needs no engine
                    farm.start_engine(tasks)
                farm.start_sandbox_actors(None if feed is not None else max(1, len(specs)))
                dispatcher = Dispatcher(cfg, farm.actors, reducer, progress, scale_out=farm.scale_out)
                dispatcher.run(specs, feed=feed)
                planned = progress.total
        finally:
            progress.close()
    except KeyboardInterrupt:
        if dispatcher is not None:
            dispatcher.interrupted = True
            dispatcher.cancel_inflight(cfg.ray.drain_timeout_s)
        else:
            raise
    finally:
        with cleanup_phase():
            summary = _finish(cfg, console, farm, dispatcher, planned, skipped, t0, started_at, out_dir, started_ray,
                              recovery, loggers)
    return summary


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
        tally = dispatcher.tally if dispatcher else SummaryTally()  # kept as rollouts finished: bounded
        summary = tally.summary(
            cfg.run_id,
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
