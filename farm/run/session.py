"""The run session: one invocation on one output directory, set up and ended one way for
every entry point (``farm run`` = :func:`farm.run.batch.run_batch`, ``farm.Farm`` =
:mod:`farm.run.continuous`, ``farm.Rollouts`` = :mod:`farm.single.service`). They differ
only in how they dispatch rollouts; what comes before and after is this::

    session = RunSession(cfg, console=console).open()   # lock, run_config.yaml, tasks, loggers
    actors = session.ray_actors()                          # Ray joined once (left at close)
    ... start the reducer; session.resume(recovery, done); plan = session.plan() ...
    ... dispatch; close the actors ...
    session.close(RunTally(...))       # summary.json + invocations.jsonl, loggers closed, lock released

``open()`` takes the run lock FIRST: a second invocation on the same directory fails there
and touches nothing; anything ``open()`` fails on after that releases the lock again.
``close()`` is idempotent and runs under ``cleanup_phase`` (stop signals are noted, not
raised: the summary is always written). No Ray imported here: the actors are
``farm.actors``' business; the session only remembers whether it connected.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from farm.config import FarmConfig
from farm.output.groups import GROUPS_OF_ONE
from farm.run.done import DoneRollouts
from farm.run.lock import RunLock
from farm.run.progress import RunProgress
from farm.run.signals import cleanup_phase
from farm.run.stream import Curriculum, StreamFeed, TaskStream
from farm.run.summary import RunSummary, SummaryTally, summary_table, with_history, write_summary
from farm.tasks.model import Task
from farm.loggers import RunLoggers
from farm.output.fidelity import directory_fidelity

if TYPE_CHECKING:
    from farm.actors.assembly import FarmActors
    from farm.loggers import RunLoggers
    from farm.output.rows import RolloutSummary
    from farm.rollout.model import RolloutSpec

log = logging.getLogger(__name__)


def resolved(cfg: FarmConfig) -> FarmConfig:
    """``cfg`` with ``output.dir`` made absolute (the lock, run_config.yaml and the actors
    all name the same directory, whatever the working directory of each)."""
    out_dir = str(Path(cfg.output.dir).expanduser().resolve())
    return cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": out_dir})})


@dataclass
class RunTally:
    """What one invocation's dispatch did: the session's summary is made of it."""

    rollouts: SummaryTally = field(default_factory=SummaryTally)  # bounded: not one object per rollout
    planned: int = 0
    redispatched: int = 0
    retried: int = 0
    interrupted: bool = False
    lost_nodes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, dispatcher: Any, *, planned: int | None = None, lost_nodes: dict[str, str] | None = None) -> RunTally:
        """The tally of a ``farm.actors.dispatch.Dispatcher`` (None: it never started)."""
        if dispatcher is None:
            return cls(planned=planned or 0, lost_nodes=dict(lost_nodes or {}))
        rollouts = dispatcher.tally
        return cls(rollouts=rollouts, planned=rollouts.count if planned is None else planned,
                   redispatched=dispatcher.redispatched, retried=dispatcher.retried,
                   interrupted=bool(dispatcher.interrupted), lost_nodes=dict(lost_nodes or {}))  # fmt: skip

    @classmethod
    def of_summaries(cls, summaries: list[RolloutSummary], *, planned: int) -> RunTally:
        """The tally of rollouts stored one by one (``farm.Rollouts``)."""
        return cls(rollouts=SummaryTally.of(summaries), planned=planned)


@dataclass(frozen=True)
class RunPlan:
    """What this invocation runs: groups pulled from ``feed`` until it is exhausted or
    stopped. ``total``: the rollouts it will hand out, known up front on a finite stream
    (no list of them is made: ``TaskStream.count``); None when groups are counted as they
    are pulled (``stream.epochs: null``, continuous mode)."""

    feed: StreamFeed
    total: int | None
    skipped: int
    stream: TaskStream

    def __bool__(self) -> bool:
        return self.total is None or self.total > 0


class RunSession:
    """One invocation on ``cfg.output.dir``: see the module docstring."""

    def __init__(self, cfg: FarmConfig, *, tasks: list[Task] | None = None, console: Console | None = None,
                 command: str = "run") -> None:
        self.cfg = resolved(cfg)
        self.out_dir = Path(self.cfg.output.dir)
        self.console = console  # None: nothing printed (farm.Rollouts); notes go to the log
        self.command = command  # the invocations.jsonl line's command
        self._tasks_given = tasks
        self.tasks: list[Task] = []
        self.loggers: RunLoggers | None = None
        self.recovery: list[str] = []  # what opening the output repaired (from the reducer)
        self.done = DoneRollouts()  # rollouts already durable there
        self.skipped = 0
        self.summary: RunSummary | None = None
        self._lock: RunLock | None = None
        self._closed = False
        self._connected_ray = False
        self._started_at = self._t0 = 0.0

    # --- open -----------------------------------------------------------------------------
    def open(self) -> RunSession:
        """Own the output directory (first: ``RunLocked`` if another invocation does), write
        ``run_config.yaml`` (refused if the directory holds another task set's rollouts),
        load the tasks, start the run loggers. A failure releases what it took."""
        if self._lock is not None:
            return self
        if self._closed:
            raise RuntimeError("a closed run session cannot be opened again: make a new one")
        self._lock = RunLock(self.out_dir, self.cfg.run_id).acquire()
        try:
            # the task loaders and their sources load when a run opens, not on import
            from farm.output.outdir import check_tasks_source, write_run_config
            from farm.run.tasks import load_run_tasks

            check_tasks_source(self.cfg, self.out_dir)
            write_run_config(self.cfg, self.out_dir)
            self.tasks = list(self._tasks_given) if self._tasks_given is not None else load_run_tasks(self.cfg)
            self.loggers = self._start_loggers()
        except BaseException:
            self._release()
            raise
        self._started_at, self._t0 = time.time(), time.monotonic()
        return self

    def _note(self, message: str) -> None:
        if self.console is None:
            log.warning("%s", message)
        else:
            self.console.print(f"farm: {message}", highlight=False, markup=False, soft_wrap=True)

    def _start_loggers(self) -> RunLoggers:
        """The configured run loggers, started (a failing one is reported and left out)."""
        loggers = RunLoggers.from_config(self.cfg.loggers, str(self.out_dir), note=self._note)
        loggers.start(self.cfg.run_id, self.cfg.model_dump(mode="json"))
        return loggers

    @property
    def is_open(self) -> bool:
        return self._lock is not None and not self._closed

    # --- the actors' side -------------------------------------------------------------------
    def connect_ray(self) -> None:
        """Join this job's Ray (or start a local one), once; ``close()`` leaves it if this
        session connected. In the main thread: ``ray.init`` installs signal handlers."""
        from farm.actors.ray_cluster import init_ray  # Ray only once a run connects (not for its checks)

        self._connected_ray = init_ray(self.cfg) or self._connected_ray

    def ray_actors(self, **kwargs: Any) -> FarmActors:
        """The run's actors on Ray (none started yet): ``kwargs`` as ``FarmActors``'."""
        from farm.actors.assembly import FarmActors  # Ray only once a run starts its actors

        self.connect_ray()
        return FarmActors(self.cfg, **kwargs)

    def resume(self, recovery: list[str], done: Iterable[str]) -> None:
        """What the started reducer found: repairs made on opening, the ids of the rollouts
        already durable (kept a bit each on this run's tasks' groups: ``DoneRollouts``)."""
        if not self.is_open:  # the ids are placed on the tasks open() loads
            raise RuntimeError("resume() is told what the reducer found on an open session: open() it first")
        self.recovery = list(recovery)
        self.done = DoneRollouts.of(done, self.tasks, self.cfg.rollout.n_samples)

    def plan(self, *, curriculum: Curriculum | None = None, continuous: bool = False) -> RunPlan:
        """This invocation's rollouts, resumed (durable ones skipped). ``continuous``: pulled
        under back-pressure (``stream.max_ahead``) until stopped (``farm.Farm``)."""
        cfg = self.cfg
        stream = TaskStream(cfg.run_id, self.tasks, cfg.rollout.n_samples, cfg.stream, curriculum=curriculum,
                            done=self.done)  # fmt: skip
        if continuous:
            self.skipped = len(self.done)
            return RunPlan(StreamFeed(stream, cfg.stream.max_ahead), None, self.skipped, stream)
        if not stream.finite:  # stream.epochs: null: groups are pulled until the run is stopped
            return RunPlan(StreamFeed(stream), None, 0, stream)
        total, self.skipped = stream.count(cfg.rollout.limit)
        return RunPlan(StreamFeed(stream, limit=cfg.rollout.limit, total=total), total, self.skipped, stream)

    def progress(self, total: int) -> RunProgress:
        """The progress display (and the loggers' metrics), told what resuming found."""
        progress = RunProgress(self.console or Console(quiet=True), total, run_id=self.cfg.run_id,
                               out_dir=str(self.out_dir), loggers=self.loggers)  # fmt: skip
        if self.cfg.rollout.n_samples == 1:  # what a newcomer's first trainer would meet: all advantages 0
            progress.note(f"note: {GROUPS_OF_ONE}")
        if self.recovery:
            progress.note(f"recovered {self.out_dir}: " + " | ".join(self.recovery))
        if self.skipped:
            left = f", {total} to run" if total else ""  # continuous: pulled as the trainer consumes them
            progress.note(f"resuming: {self.skipped} rollouts already in {self.out_dir}{left}")
        return progress

    # --- close ------------------------------------------------------------------------------
    def close(self, tally: RunTally | None = None) -> RunSummary | None:
        """End the invocation (the actors are closed by then: the reducer has flushed):
        ``summary.json`` and an ``invocations.jsonl`` line (unless ``tally`` is None:
        nothing ran, what the directory says still holds), the table printed, the loggers
        closed with it, Ray left if this session joined it, the lock released. Idempotent:
        a second call returns the first summary."""
        if self._closed:
            return self.summary
        self._closed = True
        if self._lock is None:  # never opened (or open failed): nothing to summarize
            self._release()
            return None
        with cleanup_phase():
            try:
                if tally is not None:
                    self.summary = self._summarize(tally)
            finally:
                self._release()
        return self.summary

    def _summarize(self, tally: RunTally) -> RunSummary:
        cfg = self.cfg
        summary = tally.rollouts.summary(cfg.run_id, planned=tally.planned, skipped_done=self.skipped,
                                         wall_s=time.monotonic() - self._t0, redispatched=tally.redispatched,
                                         retried=tally.retried, interrupted=tally.interrupted)  # fmt: skip
        summary = summary.model_copy(update={"recovery": self.recovery, "lost_nodes": tally.lost_nodes})
        summary = with_history(summary, self.out_dir, started_at=self._started_at, group_size=cfg.rollout.n_samples,
                               command=self.command)  # fmt: skip
        summary = summary.model_copy(update={"fidelity": _fidelity(self.out_dir)})
        write_summary(summary, self.out_dir)
        if self.console is not None:
            self.console.print(summary_table(summary))
        return summary

    def _release(self) -> None:
        """Loggers closed (with the summary, when there is one), Ray left, lock released."""
        try:
            if self.loggers is not None:
                self.loggers.close(self.summary.model_dump(mode="json") if self.summary else None)
                self.loggers = None
        finally:
            try:
                if self._connected_ray:
                    from farm.actors.ray_cluster import leave_ray  # connected: Ray is loaded already

                    leave_ray()
                    self._connected_ray = False
            finally:
                if self._lock is not None:
                    self._lock.release()
                    self._lock = None

    def __enter__(self) -> RunSession:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fidelity(out_dir: Path) -> dict[str, Any] | None:
    """The output's token-fidelity totals (never fails the run's end)."""
    try:
        return directory_fidelity(out_dir).totals()  # the Samples checkpoint's counts and the Samples after it
    except Exception as exc:  # noqa: BLE001 - a summary field, not worth a failed run
        log.warning("token fidelity totals not computed: %s", exc)
        return None
