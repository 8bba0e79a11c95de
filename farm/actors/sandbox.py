"""SandboxActor: hosts one model gateway and runs up to ``rollout.concurrency`` rollouts
at once through the rollout pipeline.

A plain class; the driver makes it an async Ray actor (``max_restarts`` > 0,
``max_task_retries=0``: a rollout is not idempotent, the driver re-dispatches it).
Each finished rollout goes to the reducer, which decides what becomes of it (recorded, run
again, dropped: ``farm.rollout.retry``); ``run`` returns the reducer's answer, a small
RolloutSummary (durable once recorded, else carrying that decision for the dispatcher). ``run_many`` (what the dispatcher
calls) runs a batch of rollouts and streams each one's summary back as it is durable. The
rollouts that finish while earlier ones are on their way to the reducer go together, as one
``ReducerActor.submit_many`` call (``farm.actors.reducer_link``): a Ray call per batch, not
per rollout, both ways.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

from farm.actors.batches import CANCELLED, Answer
from farm.actors.calls import call
from farm.actors.reducer_link import ReducerLink
from farm.config import FarmConfig
from farm.errors import GatewayError
from farm.gateway.config import NODE_FIELDS, fill_url, url_fields
from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutResult, RolloutSpec
from farm.rollout.pipeline import RolloutPipeline
from farm.secrets import RunSecrets
from farm.trajectory.transcript import main_line_messages

log = logging.getLogger(__name__)


def _ray_node() -> str:
    try:  # Ray only when this runs as an actor: farm.single also runs the class in its own process
        import ray
    except ImportError:
        return ""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def for_this_node(cfg: FarmConfig, node: str) -> FarmConfig:
    """``cfg`` with the node fields of ``gateway.public_url`` filled in for this actor's Ray
    node (``node``: its id), so the sandboxes it runs reach its own gateway; the gateway fills
    in ``{port}`` when it binds (``farm.gateway.public_url``). Unchanged outside Ray."""
    template = cfg.gateway.public_url
    if not template or not node or not url_fields(template) & set(NODE_FIELDS):
        return cfg
    import ray  # here on a Ray node (its fields are in the template): see _ray_node

    facts = {"node_ip": ray.util.get_node_ip_address(), "node_id": node, "hostname": socket.gethostname()}
    gateway = cfg.gateway.model_copy(update={"public_url": fill_url(template, **facts)})
    return cfg.model_copy(update={"gateway": gateway})


def _answer(rollout_id: str, task: asyncio.Future[RolloutSummary]) -> Answer:
    if task.cancelled():
        return Answer(rollout_id, error=CANCELLED)
    exc = task.exception()
    if exc is not None:  # a bug in ``run`` (it maps every rollout error to a status itself)
        log.error("rollout %s: sandbox actor raised", rollout_id, exc_info=exc)
        return Answer(rollout_id, error=f"{type(exc).__name__}: {exc}")
    return Answer(rollout_id, task.result())


class SandboxActor:
    def __init__(
        self,
        cfg: FarmConfig,
        engine_url: str,
        reducer: Any,  # the reducer actor's name or handle (or any object with ``submit_many``)
        name: str = "sandbox-0",
        *,
        secrets: RunSecrets | None = None,
        metrics: bool = True,
        parts_factory: Any = None,
        engine_router: str | None = None,
    ) -> None:
        self.secrets = secrets or RunSecrets()  # the run's keys, read by the entry point
        self.cfg = cfg
        self.engine_url = engine_url
        # started while the engine starts: the router actor's name, asked for the URL on
        # ready() (again after a restart, which runs this with the same arguments)
        self._engine_router = engine_router
        self.reducer = reducer
        self._reducer_link = ReducerLink(reducer)  # resolves a name once, on first use
        self.name = name
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
        self._running: dict[str, asyncio.Future[Any]] = {}  # execute_stream's and run_many's rollouts, by id

    async def ready(self) -> str:
        """Start the gateway (once); returns its URL."""
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._pipeline is None:
                if not self.engine_url and self._engine_router:
                    self.engine_url = await call(self._engine_router, "url_when_started")
                self.node = _ray_node()
                if self._parts_factory is None:  # the real layers (not a test's or a bench's stand-in)
                    from farm.rollout.actor_layers import ActorLayers as factory
                else:
                    factory = self._parts_factory
                if self._want_metrics:  # Ray's metrics API: only where the actor exports metrics
                    from farm.actors.metrics import ActorMetrics

                    self._metrics = ActorMetrics(self.cfg.run_id)
                self._parts = factory(
                    for_this_node(self.cfg, self.node),
                    self.engine_url,
                    secrets=self.secrets,
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
                    artifacts=self.cfg.artifacts,
                    mode=self.cfg.mode,
                    node=self.node,
                    on_truncated=self.cfg.rollout.on_truncated,
                )
        return self.gateway_url

    async def where(self) -> dict[str, str]:
        """Ready, and where: its node id and the sandbox root it creates local sandboxes
        under there (the run reports a dead node's root as left behind when it closes its actors)."""
        await self.ready()
        root = ""
        if self.cfg.sandbox.backend == "local":  # the local backend's host directories (E2B has none)
            from farm.sandboxes.local_dirs import sandbox_root

            root = sandbox_root(self.cfg.sandbox.local)
        return {"name": self.name, "node": self.node, "sandbox_root": root, "gateway_url": self.gateway_url}

    async def execute(self, spec: RolloutSpec, observer: Any = None) -> RolloutResult:
        """Run one rollout through the pipeline (within this actor's slots); store nothing.
        ``observer(kind, data)`` hears its phase changes and its session's turns."""
        await self.ready()
        assert self._slots is not None and self._pipeline is not None
        watched = observer is not None and hasattr(self._parts, "observers")
        if watched:
            self._parts.observers[spec.rollout_id] = observer
        try:
            async with self._slots:
                self._set_in_flight(+1)
                try:
                    result = await self._pipeline.run(spec, observer)
                finally:
                    self._set_in_flight(-1)
            if self._metrics is not None:
                self._metrics.observe_turns(result.tree)  # the turns this actor's gateway served
            return result
        finally:
            if watched:
                self._parts.observers.pop(spec.rollout_id, None)

    async def execute_stream(self, spec: RolloutSpec) -> AsyncIterator[tuple[str, Any]]:
        """``execute`` for a caller in another process (``farm.single`` on Ray; call it with
        ``num_returns="streaming"``): yields ``("event", (kind, data))`` as the rollout goes,
        then ``("result", RolloutResult | None)``. ``abort(rollout_id)`` cancels it (the
        result still comes, status cancelled, after the pipeline cleaned up; None if it
        was still waiting for a slot)."""
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        task = asyncio.ensure_future(self.execute(spec, lambda kind, data: queue.put_nowait((kind, data))))
        self._running[spec.rollout_id] = task
        try:
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield "event", getter.result()
                else:
                    getter.cancel()
            try:
                result: RolloutResult | None = await task
            except asyncio.CancelledError:
                if not task.cancelled():
                    raise  # this stream itself was cancelled
                result = None  # aborted before the pipeline began (waiting for a slot)
            yield "result", result
        finally:
            self._running.pop(spec.rollout_id, None)
            if not task.done():  # the caller went away: do not leave the rollout running
                task.cancel()

    async def abort(self, rollout_id: str) -> bool:
        """Cancel a rollout started with ``execute_stream`` or ``run_many`` (False: not running here)."""
        task = self._running.get(rollout_id)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    def transcript(self, rollout_id: str) -> list[dict[str, Any]]:
        """The canonical messages of a running rollout's main line so far ([] if none)."""
        return main_line_messages(self.live_tree(rollout_id))

    async def run(self, spec: RolloutSpec) -> RolloutSummary:
        """Run one rollout, hand it to the reducer, return the reducer's answer: its durable
        summary, or, when the reducer decided it runs again (or is dropped), its summary not
        durable, carrying that decision for the dispatcher."""
        return await self._reducer_link.submit(await self.execute(spec))

    async def run_many(self, specs: list[RolloutSpec]) -> AsyncIterator[list[Answer]]:
        """``run`` for each of ``specs`` at once (within the slots), streamed back: yields the
        answers of the rollouts that finished since the last yield, as soon as there are any
        (call it with ``num_returns="streaming"``, Ray's default for a generator method).
        One call for many rollouts is what lets the dispatcher and this actor keep up with
        short rollouts (a Ray call costs ~1 ms of CPU each side); each rollout still ends on its own.
        ``abort(rollout_id)`` cancels one of them; cancelling the call cancels those still
        running, and returns once they cleaned up (their answers are not sent)."""
        tasks: dict[asyncio.Future[RolloutSummary], str] = {}
        ended: asyncio.Queue[asyncio.Future[RolloutSummary]] = asyncio.Queue()
        for spec in specs:
            task = asyncio.ensure_future(self.run(spec))
            task.add_done_callback(ended.put_nowait)
            tasks[task] = spec.rollout_id
            self._running[spec.rollout_id] = task
        try:
            left = len(tasks)
            while left:
                batch = [await ended.get()]
                while not ended.empty():
                    batch.append(ended.get_nowait())
                left -= len(batch)
                yield [_answer(tasks[task], task) for task in batch]
        finally:
            for task, rid in tasks.items():
                if self._running.get(rid) is task:
                    del self._running[rid]
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def live_tree(self, rollout_id: str) -> Any:
        """The turn tree of a rollout's open gateway session (None when it has none open)."""
        gateway = getattr(self._parts, "gateway", None)
        if gateway is None:
            return None
        try:
            return gateway.tree(rollout_id)
        except GatewayError:
            return None

    def _set_in_flight(self, delta: int) -> None:
        self.in_flight += delta
        if self._metrics is not None:
            self._metrics.set_in_flight(self.name, self.in_flight)

    async def stats(self) -> dict[str, Any]:
        return {"name": self.name, "in_flight": self.in_flight, "gateway_url": self.gateway_url}

    async def shutdown(self) -> None:
        """Stop the gateway and close whatever sandboxes are still open. Idempotent."""
        if self._metrics is not None:
            self._metrics.close()
        if self._parts is not None:
            await self._parts.stop()
