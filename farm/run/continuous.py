"""``farm.Farm``: the farm inside a training loop (continuous mode).

The trainer's process owns the run: ``Farm(cfg).start()`` opens the same run session as
``farm run`` (``farm.run.session``: lock, run_config.yaml, tasks, loggers, summary),
assembles the same actors (reducer, router, sandbox actors; ``farm.actors.assembly``) and
runs the same dispatch loop in a background thread, fed by the task stream (``stream:`` config:
epochs, shuffle, seed, curriculum) under back-pressure (``stream.max_ahead`` rollouts
dispatched but not yet handed to the trainer). The trainer pulls complete groups,
trains, and pushes weights through farm::

    with farm.Farm("configs/train.yaml") as f:
        for step in range(steps):
            groups = f.next_groups(8)
            ...train on [s for g in groups for s in g.samples]...
            f.update_weights("/ckpt/step-%d" % step)   # or version=step+1 after an NCCL sync

``update_weights`` pauses generation on every SGLang worker behind the router, loads
(or only stamps) the new version, resumes, and tells the reducer and the dispatcher.
Rollouts that began under older weights follow ``stream.on_stale`` (keep / drop /
abort, bounded by ``stream.max_staleness``); unless the policy is ``keep``, a group
whose oldest trained turn is beyond the bound when the trainer asks is not handed out
(``stats()["stale_groups_dropped"]``). Every Sample carries ``policy_version_min`` /
``policy_version_max``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from farm.config import FarmConfig, load_config
from farm.output.groups import Group, GroupOrder, GroupReader
from farm.run.session import RunSession, RunTally, resolved
from farm.run.stream import Curriculum, StreamFeed, TaskStream
from farm.run.summary import SummaryTally
from farm.secrets import RunSecrets
from farm.tasks.model import Task
from farm.run.signals import cleanup_phase

log = logging.getLogger(__name__)


class FarmStopped(RuntimeError):
    """The farm's dispatch loop ended (stream exhausted, stopped, or it failed)."""


class Farm:
    """A farm run driven by a trainer: groups out, weights in."""

    def __init__(
        self,
        cfg: FarmConfig | str | Path,
        *,
        overrides: list[str] | tuple[str, ...] = (),
        tasks: list[Task] | None = None,
        curriculum: Curriculum | None = None,
        order: GroupOrder = "completion",
        skip_existing: bool = True,
        console: Console | None = None,
        secrets: RunSecrets | None = None,
        parts_factory: Any = None,
    ) -> None:
        self.cfg = resolved(cfg if isinstance(cfg, FarmConfig) else load_config(cfg, overrides))
        self.out_dir = Path(self.cfg.output.dir)
        self._tasks, self._curriculum, self._order = tasks, curriculum, order
        self._skip_existing = skip_existing
        self.console = console or Console(stderr=True)
        # the keys the config needs, from the environment unless given (an entry point, as `farm run` is)
        self._secrets = secrets or RunSecrets.from_environ(self.cfg, os.environ)
        self._parts_factory = parts_factory
        self._session: RunSession | None = None
        self._actors: Any = None
        self._dispatcher: Any = None
        self._feed: StreamFeed | None = None
        self._stream: TaskStream | None = None
        self._reader: GroupReader | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._ready: list[Group] = []
        self._progress: Any = None
        self._incomplete_seen = 0
        self.stale_groups_dropped = 0
        self.groups_consumed = 0
        self.summary: Any = None

    # --- lifecycle ---------------------------------------------------------------
    def start(self) -> Farm:
        # heavy: ray
        from farm.actors.dispatch import Dispatcher

        cfg = self.cfg
        session = self._session = RunSession(cfg, tasks=self._tasks, console=self.console).open()  # lock first
        try:
            self._actors = session.ray_actors(secrets=self._secrets, parts_factory=self._parts_factory)
            reducer = self._actors.start_reducer()
            session.resume(*self._actors.reducer_facts())
            plan = session.plan(curriculum=self._curriculum, continuous=True)
            self._stream, self._feed = plan.stream, plan.feed
            self._reader = GroupReader(self.out_dir, size=cfg.rollout.n_samples, order=self._order)
            if self._skip_existing:  # groups an earlier invocation finished were handed to an earlier trainer
                self._reader.poll()
                self._reader.incomplete.clear()
            if self._parts_factory is None:
                self._actors.start_engine(session.tasks, wait=False)  # beside the sandbox actors' start
            self._actors.start_sandbox_actors()
            self._progress = session.progress(0)
            self._dispatcher = Dispatcher(cfg, self._actors.actors, reducer, self._progress, SummaryTally(),
                                          scale_out=self._actors.scale_out, admit=self._actors.admit)
            version = self.policy_version
            self._actors.set_policy_version(version)
            self._dispatcher.set_policy_version(version)
        except BaseException:
            self._teardown()
            raise
        self._thread = threading.Thread(target=self._loop, name="farm-dispatch", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        try:
            self._dispatcher.run(feed=self._feed, stop=self._stop)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the trainer by next_groups
            log.exception("farm dispatch loop failed")
            self._error = exc

    def __enter__(self) -> Farm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- groups out ----------------------------------------------------------------
    def next_groups(self, k: int = 1, timeout: float | None = None, *, poll_interval: float = 0.2) -> list[Group]:
        """The next ``k`` complete groups (fewer only if ``timeout`` passes or the stream
        ends: an empty list then means nothing more will come). Unless ``stream.on_stale``
        is ``keep``, a group whose oldest trained turn is more than ``stream.max_staleness``
        versions behind *now* is not handed out (``stale_groups_dropped``)."""
        if self._reader is None:
            raise FarmStopped("Farm.start() was not called")
        deadline = None if timeout is None else time.monotonic() + timeout
        out: list[Group] = []
        while len(out) < k:
            alive = self.running
            if len(self._ready) < k - len(out):
                self._take(self._reader.poll())
            current = self.policy_version if self._ready else 0
            while self._ready and len(out) < k:
                g = self._ready.pop(0)
                self._feed.consumed(g.size)  # handed over (or dropped): no longer ahead of the trainer
                if self.cfg.stream.too_stale(g.policy_versions[0], current, "handed_out"):
                    self.stale_groups_dropped += 1
                else:
                    out.append(g)
            if len(out) >= k:
                break
            if not alive:
                last = self._reader.poll()  # what the loop's last rollouts made durable
                if last:
                    self._take(last)
                    continue
                if self._error is not None and not out:
                    raise FarmStopped(f"the farm's dispatch loop failed: {self._error!r}") from self._error
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            time.sleep(poll_interval)
        self.groups_consumed += len(out)
        return out

    def _take(self, groups: list[Group]) -> None:
        """Groups the reader found done: seen by the curriculum, queued for the trainer."""
        assert self._feed is not None and self._reader is not None and self._stream is not None
        new_incomplete = len(self._reader.incomplete) - self._incomplete_seen
        self._incomplete_seen = len(self._reader.incomplete)
        self._feed.consumed(new_incomplete * self.cfg.rollout.n_samples)  # never handed out, no longer ahead
        for g in groups:
            self._stream.observe(g.task_id, g.reward_mean)
            self._ready.append(g)

    def groups(self, *, batch: int = 1):
        """Iterate complete groups until the stream ends (or ``stop()``)."""
        while True:
            got = self.next_groups(batch)
            if not got:
                return
            yield from got

    # --- weights in ----------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        if self._actors is None or self._actors.router is None:
            return self._dispatcher.policy_version if self._dispatcher is not None else 0
        return self._actors.policy_version()

    def update_weights(self, path: str | None = None, *, version: int | None = None) -> int:
        """New weights for every worker: load ``path`` (SGLang ``/update_weights_from_disk``),
        or, with only ``version``, stamp it (the trainer synced the weights itself).
        Returns the new policy version, stamped on every later turn."""
        if path is None and version is None:
            raise ValueError("update_weights needs a checkpoint path or a version")
        if self._actors is None or self._actors.router is None:
            raise FarmStopped("no engine: update_weights needs the farm's router (start() it first)")
        v = self._actors.update_weights(path, version)
        self._dispatcher.set_policy_version(v)
        return v

    # --- status and stop ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        d = self._dispatcher
        return {
            "policy_version": d.policy_version if d else 0,
            "groups_dispatched": self._feed.dispatched_groups if self._feed else 0,
            "groups_consumed": self.groups_consumed,
            "ahead": self._feed.ahead if self._feed else 0,
            "rollouts_finished": d.finished if d else 0,
            "stale_dropped": d.stale_dropped if d else 0,
            "stale_aborted": d.stale_aborted if d else 0,
            "stale_groups_dropped": self.stale_groups_dropped,
            "incomplete_groups": list(self._reader.incomplete) if self._reader else [],
        }

    def stop(self, *, drain: bool = False, timeout: float | None = None) -> Any:
        """Stop producing. ``drain``: no new groups, in-flight rollouts finish and are
        recorded; else they are interrupted (not recorded: a later start runs them again).
        Writes and returns the run summary. Idempotent."""
        if self.summary is not None or self._actors is None:
            return self.summary
        if self._feed is not None:
            self._feed.close()
        if not drain:
            self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._teardown()
        return self.summary

    def _teardown(self) -> None:
        """Stop the actors (the reducer flushes), then end the session: summary.json,
        loggers closed, the lock released (no summary if the actors never started)."""
        if self._session is None:
            return
        tally = None
        try:
            if self._progress is not None:
                self._progress.close()
            if self._actors is not None:
                with cleanup_phase():
                    self._actors.close()
                tally = RunTally.of(self._dispatcher, lost_nodes=self._actors.lost_nodes)
        finally:
            self.summary = self._session.close(tally)
