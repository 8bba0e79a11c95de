"""``farm run``: every rollout of a config not already in its output directory, on Ray,
locally or under ``ray job submit``. A run session (``farm.run.session``) around the
farm's actors (``farm.actors.assembly``: reducer, router, sandbox actors) and the
dispatch loop (``farm.actors.dispatch``)."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

from farm.actors.assembly import FarmActors
from farm.actors.dispatch import Dispatcher
from farm.config import FarmConfig
from farm.run.session import RunSession, RunTally
from farm.run.signals import cleanup_phase, stop_signals
from farm.run.summary import RunSummary, SummaryTally
from farm.secrets import RunSecrets
from farm.tasks.model import Task


def run_batch(
    cfg: FarmConfig,
    *,
    console: Console | None = None,
    secrets: RunSecrets | None = None,
    tasks: list[Task] | None = None,
    parts_factory: Any = None,
) -> RunSummary:
    """Run every rollout of ``cfg`` not already in ``cfg.output.dir``; return the summary.

    ``secrets``: the run's keys, never written anywhere (default: ``RunSecrets.from_environ``,
    the variables ``cfg`` needs, read here as ``farm run`` reads them).

    ``tasks`` (default: loaded from ``cfg.tasks``) and ``parts_factory`` (default: the
    real layers, ``farm.rollout.actor_layers.ActorLayers``; a factory also means no engine is
    started) are seams for tests and embedding.
    """
    session = RunSession(cfg, tasks=tasks, console=console or Console()).open()
    try:
        actors = session.ray_actors(secrets=secrets or RunSecrets.from_environ(cfg, os.environ),
                                    parts_factory=parts_factory)  # fmt: skip
    except BaseException:
        session.close()
        raise
    batch = _Batch(session, actors)
    with stop_signals():  # after ray.init, which installs its own SIGTERM handler
        try:
            batch.run(start_engine=parts_factory is None)
        finally:
            with cleanup_phase():  # a signal now is noted, not raised: the stop always finishes
                try:
                    actors.close()  # sandbox actors, the reducer (flushed), the router; reaped
                finally:
                    summary = session.close(batch.tally(actors.lost_nodes))
    assert summary is not None
    return summary


class _Batch:
    """One `farm run`'s dispatch: the plan onto the sandbox actors, until done or stopped."""

    def __init__(self, session: RunSession, actors: FarmActors) -> None:
        self.session, self.actors = session, actors
        self.dispatcher: Dispatcher | None = None
        self.planned = 0

    def run(self, *, start_engine: bool) -> None:
        session, actors, cfg = self.session, self.actors, self.session.cfg
        try:
            reducer = actors.start_reducer()
            session.resume(*actors.reducer_facts())
            plan = session.plan()
            self.planned = plan.total or 0  # endless (stream.epochs: null): counted as groups are pulled
            progress = session.progress(self.planned)
            try:
                if plan:
                    if start_engine and cfg.mode.needs_engine:  # a hosted endpoint needs none
                        actors.start_engine(session.tasks, wait=False)  # beside the sandbox actors' start
                    actors.start_sandbox_actors(None if plan.total is None else max(1, plan.total))
                    self.dispatcher = Dispatcher(cfg, actors.actors, reducer, progress, SummaryTally(),
                                                 scale_out=actors.scale_out, admit=actors.admit)
                    self.dispatcher.run(feed=plan.feed)  # groups pulled as actors have room: no list of the plan
                    self.planned = progress.total
            finally:
                progress.close()
        except KeyboardInterrupt:
            if self.dispatcher is None:
                raise
            self.dispatcher.interrupted = True
            self.dispatcher.cancel_inflight(cfg.ray.drain_timeout_s)

    def tally(self, lost_nodes: dict[str, str]) -> RunTally:
        return RunTally.of(self.dispatcher, planned=self.planned, lost_nodes=lost_nodes)
