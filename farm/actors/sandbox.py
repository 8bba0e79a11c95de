"""SandboxActor: hosts one model gateway and runs up to ``rollout.concurrency`` rollouts
at once through the rollout pipeline.

A plain class; the driver makes it an async Ray actor (``max_restarts`` > 0,
``max_task_retries=0``: a rollout is not idempotent, the driver re-dispatches it).
Each finished rollout goes to the reducer; ``run`` returns only once the reducer
acknowledged it (durable), with a small RolloutSummary. Cancelled rollouts are not
stored (a rerun runs them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from farm.config import FarmConfig
from farm.rollout.model import RolloutSpec, RolloutSummary
from farm.rollout.pipeline import RolloutPipeline
from farm.status import FailureClass, RolloutStatus

log = logging.getLogger(__name__)


async def call(handle: Any, method: str, *args: Any) -> Any:
    """Call ``method`` on a Ray actor handle (or a named actor), or on a plain object (in-process tests)."""
    if isinstance(handle, str):
        import ray

        handle = ray.get_actor(handle)
    fn = getattr(handle, method)
    remote = getattr(fn, "remote", None)
    if remote is not None:
        return await remote(*args)
    result = fn(*args)
    return await result if asyncio.iscoroutine(result) else result


def _ray_node() -> str:
    try:
        import ray
    except ImportError:
        return ""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


class SandboxActor:
    def __init__(
        self,
        cfg: FarmConfig,
        engine_url: str,
        reducer: Any,  # the reducer actor's name (or any object with ``submit``)
        name: str = "sandbox-0",
        *,
        e2b_api_key: str | None = None,
        metrics: bool = True,
        parts_factory: Any = None,
    ) -> None:
        self.cfg = cfg
        self.engine_url = engine_url
        self.reducer = reducer
        self.name = name
        self.e2b_api_key = e2b_api_key
        self._want_metrics = metrics
        self._parts_factory = parts_factory
        self._metrics: Any = None
        self._parts: Any = None
        self._pipeline: RolloutPipeline | None = None
        self._slots: asyncio.Semaphore | None = None
        self._start_lock: asyncio.Lock | None = None
        self.gateway_url = ""
        self.node = ""  # the Ray node id it runs on ('' outside Ray): recorded with each rollout
        self.in_flight = 0
        self._stopping = False  # the run is stopping: rollouts that end now are interrupted

    async def ready(self) -> str:
        """Start the gateway (once); returns its URL."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._pipeline is None:
                self.node = _ray_node()
                if self._parts_factory is None:
                    from farm.rollout.parts import FarmParts as factory
                else:
                    factory = self._parts_factory
                if self._want_metrics:
                    from farm.actors.metrics import FarmMetrics

                    self._metrics = FarmMetrics(self.cfg.run_id)
                self._parts = factory(
                    self.cfg,
                    self.engine_url,
                    e2b_api_key=self.e2b_api_key,
                    on_sandbox_created=self._metrics.observe_sandbox_create if self._metrics else None,
                )
                self.gateway_url = await self._parts.start()
                self._slots = asyncio.Semaphore(self.cfg.rollout.concurrency)
                self._pipeline = RolloutPipeline(
                    self._parts,
                    harness=self.cfg.harness.name,
                    model=self.cfg.engine.model_name,
                    timeout_s=self.cfg.rollout.timeout_s,
                    agent_timeout_s=self.cfg.rollout.agent_timeout_s,
                    actor=self.name,
                    node=self.node,
                )
        return self.gateway_url

    async def where(self) -> dict[str, str]:
        """Ready, and where: its node id and the sandbox root it creates local sandboxes
        under there (``farm.driver`` reports a dead node's root as left behind)."""
        await self.ready()
        root = ""
        if self.cfg.sandbox.backend == "local":
            from farm.sandboxes.local_dirs import sandbox_root

            root = sandbox_root(self.cfg.sandbox.local)
        return {"name": self.name, "node": self.node, "sandbox_root": root, "gateway_url": self.gateway_url}

    async def run(self, spec: RolloutSpec) -> RolloutSummary:
        """Run one rollout, hand it to the reducer, return its (durable) summary."""
        await self.ready()
        assert self._slots is not None and self._pipeline is not None
        async with self._slots:
            self._set_in_flight(+1)
            try:
                result = await self._pipeline.run(spec)
            finally:
                self._set_in_flight(-1)
        status = result.status
        if status is RolloutStatus.CANCELLED or (self._stopping and status is not RolloutStatus.COMPLETED):
            # Stopped under it (cancelled, its sandbox closed, its CLI killed): not a result.
            why = f"the run was stopped while it ran ({status.value}: {result.reason[:200]}); it runs again"
            return result.summary().model_copy(
                update={"status": RolloutStatus.INTERRUPTED, "reason": why, "durable": False}
            )
        if status.failure_class is FailureClass.INFRASTRUCTURE and spec.attempt <= self.cfg.rollout.infra_retries:
            # Not recorded yet: the driver runs it again after a backoff (the last attempt is recorded).
            return result.summary().model_copy(update={"durable": False})
        return await call(self.reducer, "submit", result)

    async def stop_accepting(self) -> None:
        """The run is stopping: whatever ends from now on (but a finished completion) is interrupted."""
        self._stopping = True

    def _set_in_flight(self, delta: int) -> None:
        self.in_flight += delta
        if self._metrics is not None:
            self._metrics.set_in_flight(self.name, self.in_flight)

    async def stats(self) -> dict[str, Any]:
        return {"name": self.name, "in_flight": self.in_flight, "gateway_url": self.gateway_url}

    async def shutdown(self) -> None:
        """Stop the gateway and close whatever sandboxes are still open. Idempotent."""
        self._stopping = True
        if self._parts is not None:
            await self._parts.stop()
