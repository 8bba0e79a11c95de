"""The farm's actors on Ray, assembled and taken down: the reducer (pinned to the node
holding the output directory), the router (near the engine), the sandbox actors where
``placement`` puts them (and on sandbox nodes that join mid-run), and on ``close()`` what
became of the sandboxes of actors and nodes that died (reaped, or reported left behind).

The run session (``farm.run.session``: ``farm run``, ``farm.Farm``, ``farm.Rollouts`` on
Ray) starts the farm through :class:`FarmActors`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError, RayTaskError

from farm.actors import placement
from farm.actors.dispatch import ACTOR_LOST, CONTROL_TIMEOUT_S
from farm.config import FarmConfig
from farm.secrets import RunSecrets
from farm.tasks.model import Task

log = logging.getLogger(__name__)

# The reducer concatenates ~1M-token sessions into fresh arrays: with glibc's default
# thresholds every such call returns its memory to the kernel and page-faults it back
# (400-turn linearize 6x slower than 100-turn instead of 4x: scripts/bench_trajectory.py).
# A resident reducer keeps its arenas instead.
REDUCER_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def actor_name(run_id: str, role: str) -> str:
    return f"farm-{run_id}-{role}"


def init_ray(cfg: FarmConfig) -> bool:
    """Join the Ray this job runs in (``ray job submit`` sets RAY_ADDRESS; or ``ray.address``),
    else start a local one. True if this call connected: the caller then calls
    ``ray.shutdown()``, which only disconnects from a cluster it did not start."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"namespace": cfg.ray.namespace, "log_to_driver": True}
    if cfg.ray.address is not None:
        kwargs["address"] = cfg.ray.address
    if cfg.ray.num_cpus is not None:
        kwargs["num_cpus"] = cfg.ray.num_cpus
    if cfg.ray.include_dashboard is not None:
        kwargs["include_dashboard"] = cfg.ray.include_dashboard
    try:
        ray.init(**kwargs)
    except ValueError:
        # num_cpus / include_dashboard are refused when joining an existing cluster.
        kwargs.pop("num_cpus", None)
        kwargs.pop("include_dashboard", None)
        ray.init(**kwargs)
    return True


def leave_ray() -> None:
    """Disconnect from Ray (a local instance this process started stops with it); the
    counterpart of an ``init_ray`` that returned True."""
    ray.shutdown()


def _kill_stale(name: str, namespace: str) -> None:
    try:
        stale = ray.get_actor(name, namespace=namespace)
    except ValueError:
        return
    log.warning("killing stale actor %s from an earlier driver", name)
    ray.kill(stale, no_restart=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=namespace)
        except ValueError:
            return
        time.sleep(0.2)


class FarmActors:
    """The actors of one run; ``close()`` stops everything it started."""

    def __init__(self, cfg: FarmConfig, *, secrets: RunSecrets | None = None, parts_factory: Any = None) -> None:
        self.cfg = cfg
        self.secrets = secrets or RunSecrets()
        self.parts_factory = parts_factory
        self.reducer: Any = None
        self.router: Any = None
        self.engine_url: str = ""
        self.actors: dict[str, Any] = {}
        self.where: dict[str, Any] = {}  # actor name -> ref of its where(): node id, sandbox root
        self.watch: placement.NodeWatch | None = None  # sandbox nodes joining mid-run (per-node placement)
        self.lost_nodes: dict[str, str] = {}  # node id -> what became of its sandboxes (filled by close)
        self.reaped_on_join: dict[str, list[str]] = {}  # sandbox root -> sandboxes reaped when its node joined

    def start_reducer(self) -> Any:
        """Start (or restart after a crash) the one reducer, pinned to this node."""
        from farm.actors.reducer import ReducerActor

        name = actor_name(self.cfg.run_id, "reducer")
        _kill_stale(name, self.cfg.ray.namespace)
        # The reducer writes the output directory: keep it on the driver's node.
        self.reducer = (
            ray.remote(ReducerActor)
            .options(
                name=name,
                num_cpus=0,
                max_restarts=-1,
                max_task_retries=-1,  # every method is idempotent (exactly once by rollout id)
                max_concurrency=1000,
                runtime_env={"env_vars": dict(REDUCER_MALLOC_ENV)},
                **placement.reducer_options(),
            )
            .remote(self.cfg)
        )
        ray.get(self.reducer.ready.remote(), timeout=CONTROL_TIMEOUT_S)
        return self.reducer

    def reducer_facts(self) -> tuple[list[str], set[str]]:
        """What the started reducer found on opening the output directory: the repairs it
        made (recovery lines) and the rollout ids already durable there."""
        recovery = ray.get(self.reducer.recovery.remote(), timeout=CONTROL_TIMEOUT_S)
        return recovery, set(ray.get(self.reducer.done_ids.remote(), timeout=CONTROL_TIMEOUT_S))

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

    def start_engine(self, tasks: list[Task]) -> str:
        from farm.actors.router import RouterActor

        name = actor_name(self.cfg.run_id, "router")
        _kill_stale(name, self.cfg.ray.namespace)
        self.router = ray.remote(RouterActor).options(
            name=name, num_cpus=0, max_restarts=0, **placement.router_options(self.cfg.placement)
        ).remote(
            self.cfg.engine, tasks=tasks if self.cfg.engine.mode == "scripted" else None
        )
        self.engine_url = ray.get(self.router.start.remote(), timeout=CONTROL_TIMEOUT_S)
        return self.engine_url

    def start_sandbox_actors(self, limit: int | None = None) -> dict[str, Any]:
        """Sandbox actors where ``placement`` puts them (at most ``limit``); started and ready."""
        fixed = self.cfg.ray.num_sandbox_actors
        slots = placement.sandbox_slots(self.cfg.placement, fixed=fixed, limit=limit)
        refs = [self._start_sandbox_actor(slot)[1] for slot in slots]
        ray.get(refs, timeout=CONTROL_TIMEOUT_S)
        if fixed is None:
            self.watch = placement.NodeWatch(self.cfg.placement, {s.node for s in slots})
        return self.actors

    def scale_out(self) -> dict[str, Any]:
        """Start sandbox actors on sandbox nodes that joined since the last call:
        {actor name: ref that resolves once it is ready} (not waited for here)."""
        if self.watch is None:
            return {}
        started = {}
        for node in self.watch.joined():
            log.warning("sandbox node %s joined: starting %d sandbox actor(s) on it", node,
                        self.cfg.placement.sandbox_actors_per_node)
            self._reap_joined(node)
            for _ in range(self.cfg.placement.sandbox_actors_per_node):
                name, ref = self._start_sandbox_actor(placement.Slot(node, placement.on_node(node)))
                started[name] = ref
        return started

    def _reap_joined(self, node: str) -> None:
        """A machine coming back under a new node id: reap what this run left under its sandbox
        root before it gets work, unless a live node of this run uses the same root (a shared
        disk without a per-node root: those sandboxes may be running)."""
        if self.cfg.sandbox.backend != "local":
            return
        locations = self._locations().values()
        gone = placement.dead({loc["node"] for loc in locations})
        live = sorted({loc["sandbox_root"] for loc in locations if loc["node"] not in gone})
        reap_remote = ray.remote(num_cpus=0, max_retries=0)(_reap_sandboxes)
        try:
            root, found = ray.get(reap_remote.options(**placement.on_node(node)).remote(
                self.cfg.run_id, self.cfg.sandbox, None, live), timeout=CONTROL_TIMEOUT_S)
        except (GetTimeoutError, RayError) as exc:
            log.warning("reaping sandboxes on joining node %s failed: %s", node, exc)
            return
        if found is not None:
            self.reaped_on_join.setdefault(root, []).extend(found)
            if found:
                log.warning("node %s joined with %d sandbox(es) of this run left under %s: reaped", node, len(found), root)

    def _start_sandbox_actor(self, slot: placement.Slot) -> tuple[str, Any]:
        from farm.actors.sandbox import SandboxActor

        name = actor_name(self.cfg.run_id, f"sandbox-{len(self.actors)}")
        _kill_stale(name, self.cfg.ray.namespace)
        actor = ray.remote(SandboxActor).options(
            name=name,
            num_cpus=self.cfg.ray.sandbox_actor_cpus,
            max_restarts=self.cfg.ray.actor_max_restarts,
            max_task_retries=0,  # a rollout is not idempotent: the driver re-dispatches it
            max_concurrency=self.cfg.rollout.concurrency * 2 + 16,
            **slot.options,
        ).remote(
            self.cfg,
            self.engine_url,
            actor_name(self.cfg.run_id, "reducer"),  # looked up by name: survives reducer restarts
            name,
            secrets=self.secrets,
            parts_factory=self.parts_factory,
        )
        self.actors[name] = actor
        # Small, so kept in this process: still readable after the actor's node died.
        self.where[name] = actor.where.remote()
        return name, self.where[name]

    def close(self) -> None:
        """Stop sandbox actors (they close their sandboxes), flush the reducer, stop the engine,
        reap what dead actors left; say what became of the sandboxes of nodes that died."""
        locations = self._locations()
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
        reaped = self.reap()
        self._account_lost_nodes(locations, reaped)

    def _locations(self) -> dict[str, dict[str, str]]:
        """Actor name -> {node, sandbox_root} of every sandbox actor that got ready (one not
        ready by now ran nothing: not waited for)."""
        refs = list(self.where.values())
        ready = set(ray.wait(refs, num_returns=len(refs), timeout=1.0, fetch_local=False)[0]) if refs else set()
        out = {}
        for name, ref in self.where.items():
            if ref not in ready:
                continue
            try:
                out[name] = ray.get(ref, timeout=5)
            except Exception:  # noqa: BLE001 - it failed to start: it ran nothing
                continue
        return out

    def _account_lost_nodes(self, locations: dict[str, dict[str, str]], reaped: dict[str, list[str]]) -> None:
        """Nodes that died holding sandbox actors: their sandboxes were reaped if the machine
        came back (a live node with the same sandbox root reaped them), else they are left."""
        used = {loc["node"]: loc["sandbox_root"] for loc in locations.values() if loc.get("node")}
        for node in sorted(placement.dead(set(used))):
            root = used[node]
            if self.cfg.sandbox.backend != "local":
                self.lost_nodes[node] = f"died; its {self.cfg.sandbox.backend} sandboxes were reaped by run id"
            elif root in self.reaped_on_join:
                n = len(self.reaped_on_join[root]) + len(reaped.get(root, []))
                self.lost_nodes[node] = f"died; came back: {n} sandbox(es) reaped under {root} when it rejoined"
            elif root in reaped:
                self.lost_nodes[node] = (f"died; came back: {len(reaped[root])} sandbox(es) reaped under {root} "
                                         f"at the end of the run")
            else:
                self.lost_nodes[node] = (f"died and is not back: its sandboxes under {root} are left behind "
                                         f"(run `farm reap --run-id {self.cfg.run_id}` on it)")
            log.warning("node %s %s", node, self.lost_nodes[node])

    def reap(self) -> dict[str, list[str]]:
        """Kill sandboxes of this run that outlived their actor (an actor that died), on
        every alive node: {sandbox root: sandbox ids reaped there}."""
        reap_remote = ray.remote(num_cpus=0, max_retries=0)(_reap_sandboxes)
        if self.cfg.sandbox.backend == "local":
            refs = [
                reap_remote.options(**placement.on_node(n["NodeID"])).remote(self.cfg.run_id, self.cfg.sandbox, None)
                for n in placement.alive_nodes()
            ]
        else:
            refs = [reap_remote.remote(self.cfg.run_id, self.cfg.sandbox, self.secrets.e2b_api_key)]
        reaped: dict[str, list[str]] = {}
        deadline = time.monotonic() + 120
        for ref in refs:  # one by one: a node that fails to reap (or dies now) costs only its own
            try:
                root, found = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
            except (GetTimeoutError, RayError) as exc:
                log.warning("reaping sandboxes of run %s failed: %s", self.cfg.run_id, exc)
                continue
            reaped.setdefault(root, []).extend(found)
        found = [sid for ids in reaped.values() for sid in ids]
        if found:
            log.warning("reaped %d sandbox(es) left by dead actors: %s", len(found), found)
        return reaped


def _reap_sandboxes(run_id: str, sandbox_cfg: Any, e2b_api_key: str | None,
                    skip_roots: list[str] | None = None) -> tuple[str, list[str] | None]:
    """(the sandbox root it looked in, the sandboxes it killed; None: the root is in
    ``skip_roots``, left alone)."""
    import asyncio

    if sandbox_cfg.backend == "local":
        from farm.sandboxes.local import reap, sandbox_root

        root = sandbox_root(sandbox_cfg.local)
        if root in (skip_roots or ()):
            return root, None
        return root, asyncio.run(reap(run_id, cfg=sandbox_cfg.local))
    if not e2b_api_key:
        return "", []
    from farm.sandboxes.e2b import reap as reap_e2b

    return "", asyncio.run(reap_e2b(run_id, api_key=e2b_api_key, cfg=sandbox_cfg.e2b))


def _wait_quietly(refs: list[Any], timeout: float) -> None:
    try:
        ray.get(refs, timeout=timeout)
    except (GetTimeoutError, RayTaskError, *ACTOR_LOST) as exc:
        log.warning("shutdown step failed: %s", exc)
