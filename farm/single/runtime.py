"""What ``farm.Rollouts`` runs its actors on (its ``placement``): the same actor classes,
in this process or on Ray. (Which node of a Ray cluster runs what is ``farm.actors.placement``.)

- ``InProcess``: the ``RouterActor``, one ``SandboxActor`` per harness and the
  ``ReducerActor`` as plain objects in the caller's event loop (no Ray needed).
- ``OnRay``: the farm's actors on a Ray cluster, started the way ``farm run`` starts
  them (the run session's ``FarmActors``, ``farm.actors.assembly``: named, the reducer
  pinned to this node, sandbox actors spread; the session joins and leaves Ray); a
  rollout runs on its harness's sandbox actor, its events stream back
  (``SandboxActor.execute_stream``, a Ray streaming generator), an abort is a call to
  that actor (``SandboxActor.abort``).

Both offer: ``start(session)`` (an open ``farm.run.session.RunSession``),
``actor(harness)``, ``execute(actor, spec, observer)``, ``abort(actor, rollout_id)``,
``transcript(actor, rollout_id)``, ``submit(result)``, ``done_ids()``, ``close()``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from farm.actors.calls import call
from farm.actors.sandbox import SandboxActor
from farm.config import FarmConfig
from farm.rollout.model import RolloutResult, RolloutSpec
from farm.run.session import RunSession
from farm.secrets import RunSecrets


def _harness_config(cfg: FarmConfig, harness: str) -> FarmConfig:
    return cfg.model_copy(update={"harness": cfg.harness.model_copy(update={"name": harness})})


class InProcess:
    cancels_locally = True  # abort = cancel the handle's task (the pipeline runs in this loop)

    def __init__(self, cfg: FarmConfig, *, secrets: RunSecrets, parts_factory: Any = None) -> None:
        self.cfg, self.secrets, self.parts_factory = cfg, secrets, parts_factory  # secrets: read by the entry point
        self.reducer: Any = None
        self.router: Any = None
        self.engine_url = ""
        self.actors: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def start(self, session: RunSession) -> None:
        # heavy: ray (the reducer actor), only when a rollout is stored
        from farm.actors.reducer import ReducerActor

        tasks = session.tasks
        # the reducer decides each attempt's end; a single service reruns nothing (its caller
        # starts another rollout if it wants one), so every attempt is recorded as it ended
        once = self.cfg.model_copy(update={
            "rollout": self.cfg.rollout.model_copy(update={"infra_retries": 0, "max_attempts": 1}),
            "stream": self.cfg.stream.model_copy(update={"max_stale_reruns": 0})})  # fmt: skip
        self.reducer = ReducerActor(once, metrics=False)
        if self.parts_factory is None and self.cfg.mode.needs_engine:  # else a test seam / a hosted endpoint
            from farm.actors.router import RouterActor

            engine = self.cfg.engine
            self.router = RouterActor(engine, tasks=tasks if engine.mode == "simulator" else None)
            self.engine_url = await self.router.start()

    async def actor(self, harness: str) -> Any:
        """The sandbox actor running ``harness`` (started on first use: its gateway)."""
        async with self._lock:
            actor = self.actors.get(harness)
            if actor is None:
                actor = self._new_actor(_harness_config(self.cfg, harness), f"single-{harness}")
                await call(actor, "ready")
                self.actors[harness] = actor
        return actor

    def _new_actor(self, cfg: FarmConfig, name: str) -> Any:
        return SandboxActor(cfg, self.engine_url, self.reducer, name, secrets=self.secrets, metrics=False,
                            parts_factory=self.parts_factory)  # fmt: skip

    async def execute(self, actor: Any, spec: RolloutSpec, observer: Any) -> RolloutResult | None:
        return await actor.execute(spec, observer)

    async def abort(self, actor: Any, rollout_id: str) -> bool:
        return False  # never called: cancels_locally

    async def transcript(self, actor: Any, rollout_id: str) -> list[dict[str, Any]]:
        return await call(actor, "transcript", rollout_id)

    async def submit(self, result: RolloutResult) -> Any:
        return await call(self.reducer, "submit", result)

    async def done_ids(self) -> list[str]:
        return await call(self.reducer, "done_ids")

    async def close(self) -> None:
        for actor in self.actors.values():
            await actor.shutdown()
        self.actors.clear()
        if self.reducer is not None:
            await self.reducer.close()
            self.reducer = None
        if self.router is not None:
            await self.router.shutdown()
            self.router = None


class OnRay(InProcess):
    """The farm's actors on Ray (the cluster this process joins, or a local one)."""

    cancels_locally = False

    def __init__(self, cfg: FarmConfig, *, secrets: RunSecrets, parts_factory: Any = None) -> None:
        super().__init__(cfg, secrets=secrets, parts_factory=parts_factory)
        self.farm: Any = None

    async def start(self, session: RunSession) -> None:
        # in this (the main) thread: ray.init installs signal handlers
        self.farm = session.ray_actors(secrets=self.secrets, parts_factory=self.parts_factory)
        self.reducer = await asyncio.to_thread(self.farm.start_reducer)
        if self.parts_factory is None and self.cfg.mode.needs_engine:
            self.engine_url = await asyncio.to_thread(self.farm.start_engine, session.tasks)

    def _new_actor(self, cfg: FarmConfig, name: str) -> Any:
        # heavy: ray
        from farm.actors.ray_cluster import actor_name

        full, _ = self.farm.start_sandbox_actor(
            actor_name(self.cfg.run_id, name), cfg, max_restarts=0,
            max_concurrency=self.cfg.rollout.concurrency * 4 + 16, scheduling_strategy="SPREAD",
        )  # fmt: skip
        return self.farm.actors[full]

    async def execute(self, actor: Any, spec: RolloutSpec, observer: Any) -> RolloutResult | None:
        """Follow the actor's event stream; the last item is the result (None: cancelled
        before it began)."""
        stream = actor.execute_stream.options(num_returns="streaming").remote(spec)
        async for ref in stream:
            kind, item = await ref
            if kind == "event":
                observer(*item)
            else:
                return item
        raise RuntimeError(f"the sandbox actor's stream for {spec.rollout_id} ended without a result")

    async def abort(self, actor: Any, rollout_id: str) -> bool:
        return bool(await actor.abort.remote(rollout_id))

    async def close(self) -> None:
        if self.farm is not None:
            await asyncio.to_thread(self.farm.close)  # sandbox actors, reducer (flushed), router; reap
            self.farm = None
        self.actors.clear()
        self.reducer = self.router = None
