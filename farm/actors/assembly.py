"""The farm's actors on Ray, started, scaled out and closed: the reducer (pinned to the
node holding the output directory), the router (near the engine), the sandbox actors
where ``placement`` puts them (and on sandbox nodes that join mid-run). What dead actors
and nodes left behind is ``farm.actors.reaping``'s; joining Ray and the actors' names,
``farm.actors.ray_cluster``'s.

The run session (``farm.run.session``: ``farm run``, ``farm.Farm``, ``farm.Rollouts`` on
Ray) starts the farm through :class:`FarmActors`.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayTaskError

from farm.actors import placement, ray_cluster
from farm.actors.membership import ACTOR_LOST, CONTROL_TIMEOUT_S
from farm.actors.reaping import Reaper, locations
from farm.config import ONE_URL_PER_ACTOR, FarmConfig
from farm.errors import ConfigError
from farm.secrets import RunSecrets
from farm.tasks.model import Task

log = logging.getLogger(__name__)

class FarmActors:
    """The actors of one run; ``close()`` stops everything it started."""

    def __init__(self, cfg: FarmConfig, *, secrets: RunSecrets | None = None, parts_factory: Any = None) -> None:
        self.cfg = cfg
        self.secrets = secrets or RunSecrets()
        self.parts_factory = parts_factory
        self.reducer: Any = None
        self.router: Any = None
        self.engine_url: str = ""
        self._engine_start: Any = None  # the router's start() in flight (start_engine(wait=False))
        self.actors: dict[str, Any] = {}
        self.where: dict[str, Any] = {}  # actor name -> ref of its where(): node id, sandbox root
        self.watch: placement.NodeWatch | None = None  # sandbox nodes joining mid-run (per-node placement)
        self.reaper = Reaper(cfg, self.secrets)
        self.gateway_urls: dict[str, str] = {}  # gateway.public_url as each sandbox actor filled it -> the actor

    @property
    def lost_nodes(self) -> dict[str, str]:
        """Node id -> what became of its sandboxes (filled by ``close``)."""
        return self.reaper.lost_nodes

    def start_reducer(self) -> Any:
        """Start (or restart after a crash) the one reducer, pinned to this node."""
        # heavy: aiohttp, orjson
        from farm.actors.reducer import ReducerActor

        name = ray_cluster.actor_name(self.cfg.run_id, "reducer")
        ray_cluster.kill_stale(name, self.cfg.ray.namespace)
        # The reducer writes the output directory: keep it on the driver's node.
        self.reducer = (
            ray.remote(ReducerActor)
            .options(
                name=name,
                num_cpus=0,
                max_restarts=-1,
                max_task_retries=-1,  # every method is idempotent (exactly once by rollout id)
                max_concurrency=1000,
                **placement.reducer_options(),
            )
            .remote(self.cfg, steady_memory=True)
        )
        ray.get(self.reducer.ready.remote(), timeout=CONTROL_TIMEOUT_S)
        return self.reducer

    def reducer_facts(self) -> tuple[list[str], list[str]]:
        """What the started reducer found on opening the output directory: the repairs it
        made (recovery lines) and the rollout ids already durable there (distinct, in no
        order: the session keeps them as bits, ``farm.run.done``)."""
        recovery = ray.get(self.reducer.recovery.remote(), timeout=CONTROL_TIMEOUT_S)
        return recovery, ray.get(self.reducer.done_ids.remote(), timeout=CONTROL_TIMEOUT_S)

    # --- weights (farm.Farm): the router's workers, the reducer's stamp ----------------------
    def policy_version(self) -> int:
        """The engine's current weight version (its router's)."""
        return int(ray.get(self.router.policy_version.remote(), timeout=CONTROL_TIMEOUT_S))

    def set_policy_version(self, version: int) -> None:
        """Tell the reducer the weight version turns are now generated under."""
        ray.get(self.reducer.set_policy_version.remote(version), timeout=CONTROL_TIMEOUT_S)

    def update_weights(self, path: str | None, version: int | None) -> int:
        """New weights on every worker behind the router (load ``path``, or stamp ``version``),
        then the reducer told: the new version."""
        update = ray.get(self.router.update_weights.remote(path, version), timeout=None)
        self.set_policy_version(update.policy_version)
        return update.policy_version

    def start_engine(self, tasks: list[Task], *, wait: bool = True) -> str:
        """Start the router (and the engine behind it). ``wait=False`` returns at once: the
        sandbox actors started next come up beside it (their processes and imports no longer
        after the engine's own start: 3.7 s of a 2-rollout ``farm run`` here, a GPU engine's
        model load on a cluster) and ask the router for its URL when they get ready;
        ``start_sandbox_actors`` waits for the engine first, so its failure is reported as
        itself. Returns the URL ('' if not waited)."""
        # heavy: aiohttp
        from farm.actors.router import RouterActor

        name = self._router_name()
        ray_cluster.kill_stale(name, self.cfg.ray.namespace)
        self.router = ray.remote(RouterActor).options(
            name=name, num_cpus=0, max_restarts=0, **placement.router_options(self.cfg.placement)
        ).remote(
            self.cfg.engine, tasks=tasks if self.cfg.engine.mode == "simulator" else None
        )
        self._engine_start = self.router.start.remote()
        return self.engine_ready() if wait else ""

    def engine_ready(self) -> str:
        """The engine's URL, once the start in flight is done (raises its failure)."""
        if self._engine_start is not None:
            start, self._engine_start = self._engine_start, None
            self.engine_url = ray.get(start, timeout=CONTROL_TIMEOUT_S)
        return self.engine_url

    def _router_name(self) -> str:
        return ray_cluster.actor_name(self.cfg.run_id, "router")

    def start_sandbox_actors(self, limit: int | None = None) -> dict[str, Any]:
        """Sandbox actors where ``placement`` puts them (at most ``limit``); started and ready."""
        fixed = self.cfg.ray.num_sandbox_actors
        slots = placement.sandbox_slots(self.cfg.placement, fixed=fixed, limit=limit)
        refs = [self._start_sandbox_actor(slot)[1] for slot in slots]
        self.engine_ready()  # an engine starting beside them: its failure first, as itself
        for where in ray.get(refs, timeout=CONTROL_TIMEOUT_S):
            refused = self.admit(where)
            if refused:
                raise ConfigError(refused)
        if fixed is None:
            self.watch = placement.NodeWatch(self.cfg.placement, {s.node for s in slots})
        return self.actors

    def admit(self, where: dict[str, str]) -> str | None:
        """Why a ready sandbox actor (its ``where()``) may not take rollouts: its gateway is
        reached at the same public URL as another actor's (the sandboxes of both would reach one
        gateway); None: it may. Only ``gateway.public_url`` reaches a gateway from off its node."""
        if not self.cfg.gateway.public_url:
            return None
        url, name = where.get("gateway_url", ""), where.get("name", "")
        other = self.gateway_urls.setdefault(url, name)
        if other == name:
            return None
        return (f"sandbox actors {other} and {name} (node {where.get('node', '')[:12]}) would both be reached at "
                f"{url} (gateway.public_url {self.cfg.gateway.public_url!r}): {ONE_URL_PER_ACTOR}")  # fmt: skip

    def scale_out(self) -> dict[str, Any]:
        """Start sandbox actors on sandbox nodes that joined since the last call:
        {actor name: ref that resolves once it is ready} (not waited for here)."""
        if self.watch is None:
            return {}
        started = {}
        for node in self.watch.joined():
            log.warning("sandbox node %s joined: starting %d sandbox actor(s) on it", node,
                        self.cfg.placement.sandbox_actors_per_node)
            self.reaper.on_join(node, self.where)
            for _ in range(self.cfg.placement.sandbox_actors_per_node):
                name, ref = self._start_sandbox_actor(placement.Slot(node, placement.on_node(node)))
                started[name] = ref
        return started

    def _start_sandbox_actor(self, slot: placement.Slot) -> tuple[str, Any]:
        name = ray_cluster.actor_name(self.cfg.run_id, f"sandbox-{len(self.actors)}")
        ray_cluster.kill_stale(name, self.cfg.ray.namespace)
        return self.start_sandbox_actor(
            name, self.cfg,
            max_restarts=self.cfg.ray.actor_max_restarts,
            max_concurrency=self.cfg.rollout.concurrency * 2 + 16,
            **slot.options,
        )  # fmt: skip

    def start_sandbox_actor(self, name: str, cfg: FarmConfig, **options: Any) -> tuple[str, Any]:
        """Start the sandbox actor ``name`` running ``cfg`` with Ray ``options`` (a run's pool
        above; ``farm.Rollouts`` one per harness): stopped by ``close()`` with the others, and
        its node recorded, so what it left behind is accounted for if that node dies.
        Returns (name, a ref that resolves to where it runs once it is ready)."""
        # heavy: aiohttp, orjson
        from farm.actors.sandbox import SandboxActor

        actor = ray.remote(SandboxActor).options(
            name=name,
            num_cpus=self.cfg.ray.sandbox_actor_cpus,
            max_task_retries=0,  # a rollout is not idempotent: the driver re-dispatches it
            **options,
        ).remote(
            cfg,
            self.engine_url,
            ray_cluster.actor_name(self.cfg.run_id, "reducer"),  # looked up by name: survives reducer restarts
            name,
            secrets=self.secrets,
            parts_factory=self.parts_factory,
            engine_router=self._router_name() if self._engine_start is not None else None,
        )
        self.actors[name] = actor
        # Small, so kept in this process: still readable after the actor's node died.
        self.where[name] = actor.where.remote()
        return name, self.where[name]

    def close(self) -> None:
        """Stop sandbox actors (they close their sandboxes), flush the reducer, stop the engine,
        reap what dead actors left; say what became of the sandboxes of nodes that died."""
        located = locations(self.where)  # where the sandbox actors ran: read before they stop
        shutdowns = [a.shutdown.remote() for a in self.actors.values()]
        _wait_quietly(shutdowns, 60)
        for a in self.actors.values():
            ray.kill(a, no_restart=True)
        self.actors.clear()
        if self.reducer is not None:
            _wait_quietly([self.reducer.close.remote()], 120)
            ray.kill(self.reducer, no_restart=True)
            self.reducer = None
        if self.router is not None:
            _wait_quietly([self.router.shutdown.remote()], 60)
            ray.kill(self.router, no_restart=True)
            self.router = None
        self.reaper.after_close(located)


def _wait_quietly(refs: list[Any], timeout: float) -> None:
    try:
        ray.get(refs, timeout=timeout)
    except (GetTimeoutError, RayTaskError, *ACTOR_LOST) as exc:
        log.warning("shutdown step failed: %s", exc)
