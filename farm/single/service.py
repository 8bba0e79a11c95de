"""``farm.Rollouts``: one rollout at a time, on demand, many at once from one process.

The same farm as ``farm run``, assembled in this process without Ray: the engine
(``RouterActor``: scripted workers behind the real router, or an external / routed
SGLang), one ``SandboxActor`` per harness (its gateway, sandboxes, grading: the same
``RolloutPipeline``) and the ``ReducerActor`` that writes Samples and the rollouts
table. Only the dispatch differs: a caller starts each rollout and watches it::

    async with farm.Rollouts("configs/local.yaml") as farm_:
        r = await farm_.start("demo-wordfreq", harness="claude_code")
        async for ev in r.events():
            print(ev)
        print(await r.finalize())     # reward, grading, diff; Samples written

A rollout is stored only when finalized; ``close()`` finalizes the finished rollouts
nobody finalized (nothing is lost) and aborts the running ones (nothing half-done is
stored). Where: the ``rollouts`` directory beside the config's ``output.dir``
(``runs/local`` -> ``runs/rollouts``), run id ``rollouts``, unless ``overrides`` name
``output.dir`` / ``run_id`` (``farm.config.load_single_config``): never into the
directory a ``farm run`` of the same config writes. One ``Rollouts`` is one run session on its output directory
(``farm.run.session``, as one ``farm run``): it owns the directory (``RunLock``), writes
``run_config.yaml``, feeds the configured ``loggers:`` and, on ``close()``, adds its line
to ``invocations.jsonl`` and rewrites ``summary.json`` (when it stored a rollout).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, Literal, get_args

from farm.config import FarmConfig, load_single_config
from farm.errors import ConfigError, TaskError
from farm.harnesses.config import HarnessName
from farm.rollout.model import RolloutSpec, Runner, make_rollout_id
from farm.run.session import RunSession, RunTally, resolved
from farm.secrets import RunSecrets
from farm.single.handle import RolloutHandle
from farm.single.inline import InlineTask, to_task
from farm.single.runtime import InProcess, OnRay
from farm.tasks.model import Task
from farm.output.manifest import default_manifest_name as manifest_name

log = logging.getLogger(__name__)

TaskLike = str | Task | InlineTask | dict[str, Any]  # a task id, a Task, or an inline task


class Rollouts:
    """The farm, one rollout at a time: ``start`` a task, watch its handle, ``finalize`` it.

    ``cfg``: a config file (or None: farm's defaults) loaded with ``overrides`` (``a.b=c``
    strings, as ``--set`` takes them, applied over the file), or a ``FarmConfig`` used as
    it is. Written to: the ``rollouts`` directory beside the config's ``output.dir``
    (``runs/local`` -> ``runs/rollouts``) with run id ``rollouts``, unless ``overrides``
    name ``output.dir`` / ``run_id`` (``out_dir`` says where). ``tasks``: the task set
    (default: the config's ``tasks.path``); ``secrets``: the E2B / hosted endpoint keys
    (default: ``E2B_API_KEY`` and the endpoint's ``api_key_env`` read from the environment);
    ``placement``: ``local`` (this process, no Ray), ``ray`` (the farm's actors on the
    Ray cluster), ``auto`` (``ray`` when ``RAY_ADDRESS`` or ``ray.address`` is set);
    ``parts_factory``: tests' hook to build the sandbox actors' parts.

    Use it as ``async with Rollouts(...) as service:`` (or ``await start_farm()`` and
    ``await close()``)."""

    def __init__(self, cfg: FarmConfig | str | Path | None = None, *, overrides: list[str] | tuple[str, ...] = (),
                 tasks: list[Task] | None = None, secrets: RunSecrets | None = None, parts_factory: Any = None,
                 placement: Literal["auto", "local", "ray"] = "auto") -> None:
        self.cfg = resolved(cfg if isinstance(cfg, FarmConfig) else load_single_config(cfg, overrides))
        self.out_dir = Path(self.cfg.output.dir)
        self._tasks_given = tasks
        self._parts_factory = parts_factory
        self.tasks: dict[str, Task] = {}
        self.handles: dict[str, RolloutHandle] = {}
        if placement == "auto":  # on a Ray cluster (a job, or ray.address): its actors
            placement = "ray" if os.environ.get("RAY_ADDRESS") or self.cfg.ray.address else "local"
        kind = OnRay if placement == "ray" else InProcess
        # the keys the config needs (E2B's, a hosted endpoint's) unless given: read here, as `farm run` does
        secrets = secrets or RunSecrets.from_environ(self.cfg, os.environ)
        self.placement = kind(self.cfg, secrets=secrets, parts_factory=parts_factory)
        self.session: RunSession | None = None
        self.summary: Any = None  # farm.run.summary.RunSummary once closed (None: nothing stored)
        self._used: set[str] = set()
        self._started = False

    # --- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> Rollouts:
        return await self.start_farm()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start_farm(self) -> Rollouts:
        """Open the run session (own the output dir, load the tasks), start the reducer and
        the engine; returns self. Idempotent. Raises ``ConfigError`` / ``TaskError`` when
        the config or the task set is bad, or the output directory is another run's."""
        if self._started:
            return self
        log.info("farm.Rollouts: run %s, writing %s", self.cfg.run_id, self.out_dir)
        session = RunSession(self.cfg, tasks=self._tasks_given, command="rollouts")
        await asyncio.to_thread(session.open)  # the lock first; the task file may be large
        self.session = session
        try:
            self.tasks = {t.id: t for t in session.tasks}
            await self.placement.start(session)
            self._used = set(await self.placement.done_ids())
        except BaseException:
            await self._teardown(None)
            raise
        self._started = True
        return self

    @property
    def running(self) -> bool:
        """Started and not closed: rollouts can be started."""
        return self._started

    async def close(self) -> None:
        """Abort running rollouts, finalize finished ones (nothing lost, nothing half-done
        stored), stop everything started, write ``summary.json`` (``self.summary``)."""
        running = [h for h in self.handles.values() if not h.done]
        await asyncio.gather(*(h.abort() for h in running), return_exceptions=True)
        for h in self.handles.values():
            try:
                await h.finalize()
            except Exception:  # noqa: BLE001 - the others still get stored
                log.exception("finalizing rollout %s on close failed", h.id)
        # This session as an invocation of the output directory (summary.json's counts are
        # read back from its rollouts table); nothing stored: what summary.json says holds.
        stored = [h.result_summary() for h in self.handles.values() if h.stored]
        await self._teardown(RunTally.of_summaries(stored, planned=len(self.handles)) if stored else None)
        self._started = False

    async def _teardown(self, tally: RunTally | None) -> None:
        try:
            await self.placement.close()
        finally:
            if self.session is not None:
                try:  # in this thread: a session that joined Ray leaves it here
                    self.summary = self.session.close(tally)
                except Exception:  # noqa: BLE001 - what is stored stays stored; the summary is a view of it
                    log.exception("writing %s/summary.json on close failed", self.out_dir)
                self.session = None

    # --- rollouts -----------------------------------------------------------------------------
    def resolve_task(self, task: TaskLike) -> Task:
        """A task id of the loaded task set, a Task, or an inline task (see farm.single.inline)."""
        if isinstance(task, Task):
            return task
        if isinstance(task, str):
            found = self.tasks.get(task)
            if found is None:
                known = ", ".join(sorted(self.tasks)[:10])
                raise TaskError(f"unknown task {task!r} in {self.cfg.tasks.path} (known: {known}"
                                f"{', ...' if len(self.tasks) > 10 else ''})")  # fmt: skip
            return found
        return to_task(task, self.out_dir)

    def _next_id(self, task_id: str) -> tuple[str, int]:
        """A rollout id this output dir has not used (stored or started here)."""
        i = 0
        while make_rollout_id(task_id, i) in self._used:
            i += 1
        rid = make_rollout_id(task_id, i)
        self._used.add(rid)
        return rid, i

    async def start(self, task: TaskLike, *, harness: str | None = None) -> RolloutHandle:
        """Start one rollout of ``task`` (a task id of the loaded set, a ``Task``, or an
        inline task: ``farm.InlineTask`` or its dict) with ``harness`` (default: the
        config's ``harness.name``); returns at once with its ``RolloutHandle`` (events,
        state, messages, abort, result, finalize) while the rollout runs in this event loop.
        Its id is ``<task id>.<i>``, the first index this output directory has not used.
        Raises ``TaskError`` for an unknown task, ``ConfigError`` for an unknown harness or
        a service not started."""
        if not self._started:
            raise ConfigError("Rollouts not started: use 'async with Rollouts(...)' or await start_farm()")
        resolved = self.resolve_task(task)
        name = harness or self.cfg.harness.name
        if name not in get_args(HarnessName):
            raise ConfigError(f"unknown harness {name!r} (one of {', '.join(get_args(HarnessName))})")
        place = self.placement
        actor = await place.actor(name)
        rid, index = self._next_id(resolved.id)
        spec = RolloutSpec(run_id=self.cfg.run_id, rollout_id=rid, group_id=resolved.id, sample_index=index,
                           task=resolved)  # fmt: skip
        handle = RolloutHandle(
            spec, Runner.of(self.cfg, harness=name), live_transcript=lambda: place.transcript(actor, rid),
            store=place.submit, outputs=self.outputs(),
            remote_abort=None if place.cancels_locally else lambda: place.abort(actor, rid),
        )  # fmt: skip
        handle.attach(asyncio.ensure_future(place.execute(actor, spec, handle.observe)))
        self.handles[rid] = handle
        return handle

    async def run(self, task: TaskLike, *, harness: str | None = None) -> dict[str, Any]:
        """Start, wait, finalize: the result summary (``RolloutHandle.finalize``'s)."""
        handle = await self.start(task, harness=harness)
        return await handle.finalize()

    def get(self, rollout_id: str) -> RolloutHandle:
        """The handle of a rollout started by this service; ``KeyError`` if unknown."""
        try:
            return self.handles[rollout_id]
        except KeyError:
            raise KeyError(f"unknown rollout {rollout_id!r}") from None

    def list(self, status: str | None = None) -> list[dict[str, Any]]:
        """The state (``RolloutHandle.state``) of every rollout started here, or of those
        with ``status`` (``running``, or how it ended: ``completed``, ``aborted``, ...)."""
        states = [h.state() for h in self.handles.values()]
        return [s for s in states if status is None or s["status"] == status]

    def outputs(self) -> dict[str, str]:
        """Where finalized rollouts go: the Samples (the trainer's table) and the rollouts table."""
        return {"output_dir": str(self.out_dir), "samples_manifest": str(self.out_dir / manifest_name("samples")),
                "rollouts_manifest": str(self.out_dir / manifest_name("rollouts"))}  # fmt: skip

