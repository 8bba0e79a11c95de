"""What dead sandbox actors and nodes left behind: their sandboxes reaped, and what
became of them said per node.

A sandbox actor that dies (or whose node dies) cannot close its sandboxes. At the end of a
run every alive node reaps the sandboxes labelled with the run id (local backend: under
the node's sandbox root; E2B: by the run id's label); a machine that comes back under a
new node id mid-run is reaped before it gets work. A node that died holding sandbox
actors is then accounted for in ``lost_nodes`` (the run summary's): reaped where it came
back, else left behind with the command that reaps them.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any
import asyncio

import ray
from ray.exceptions import GetTimeoutError, RayError

from farm.actors import placement
from farm.actors.membership import CONTROL_TIMEOUT_S
from farm.config import FarmConfig
from farm.secrets import RunSecrets

log = logging.getLogger(__name__)


def locations(where: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Actor name -> {node, sandbox_root} of every sandbox actor that got ready (``where``:
    actor name -> ref of its ``where()``; one not ready by now ran nothing: not waited for)."""
    refs = list(where.values())
    ready = set(ray.wait(refs, num_returns=len(refs), timeout=1.0, fetch_local=False)[0]) if refs else set()
    out = {}
    for name, ref in where.items():
        if ref not in ready:
            continue
        try:
            out[name] = ray.get(ref, timeout=5)
        except Exception:  # noqa: BLE001 - it failed to start: it ran nothing
            continue
    return out


class Reaper:
    """One run's reaping: on a node joining mid-run, and at the end of the run."""

    def __init__(self, cfg: FarmConfig, secrets: RunSecrets) -> None:
        self.cfg = cfg
        self.secrets = secrets
        self.lost_nodes: dict[str, str] = {}  # node id -> what became of its sandboxes (filled by after_close)
        self.reaped_on_join: dict[str, list[str]] = {}  # sandbox root -> sandboxes reaped when its node joined

    def on_join(self, node: str, where: dict[str, Any]) -> None:
        """A machine coming back under a new node id: reap what this run left under its sandbox
        root before it gets work, unless a live node of this run uses the same root (a shared
        disk without a per-node root: those sandboxes may be running)."""
        if self.cfg.sandbox.backend != "local":
            return
        located = locations(where).values()
        gone = placement.dead({loc["node"] for loc in located})
        live = sorted({loc["sandbox_root"] for loc in located if loc["node"] not in gone})
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

    def after_close(self, located: dict[str, dict[str, str]]) -> None:
        """The run's actors are gone: reap what dead ones left, then say per node that died
        (``located``: where the sandbox actors ran, taken before they were stopped) what
        became of its sandboxes."""
        self._account_lost_nodes(located, self.reap())

    def reap(self) -> dict[str, list[str]]:
        """Kill sandboxes of this run that outlived their actor (an actor that died), on
        every alive node: {sandbox root: sandbox ids reaped there}."""
        reap_remote = ray.remote(num_cpus=0, max_retries=0)(_reap_sandboxes)
        deadline = time.monotonic() + 120
        here: Future[tuple[str, list[str] | None]] | None = None  # this node's, reaped in this process
        if self.cfg.sandbox.backend == "local":
            nodes = [n["NodeID"] for n in placement.alive_nodes()]
            mine = placement.this_node() if _reaped_here(self.cfg.sandbox.local.base_dir) else None
            if mine in nodes:
                # a Ray task on the driver's own node would first start a worker process
                # (seconds of CPU at the end of every run) to list what this process can
                here = _in_thread(_reap_sandboxes, self.cfg.run_id, self.cfg.sandbox, None)
            refs = [reap_remote.options(**placement.on_node(n)).remote(self.cfg.run_id, self.cfg.sandbox, None)
                    for n in nodes if n != mine]  # fmt: skip
        else:
            refs = [reap_remote.remote(self.cfg.run_id, self.cfg.sandbox, self.secrets.e2b_api_key)]
        reaped: dict[str, list[str]] = {}
        if here is not None:
            try:
                root, found = here.result(timeout=max(1.0, deadline - time.monotonic()))
                reaped.setdefault(root, []).extend(found or [])
            except Exception as exc:  # noqa: BLE001 - as a failed reap task: said, the other nodes still reaped
                log.warning("reaping sandboxes of run %s on this node failed: %s", self.cfg.run_id, exc)
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

    def _account_lost_nodes(self, located: dict[str, dict[str, str]], reaped: dict[str, list[str]]) -> None:
        """Nodes that died holding sandbox actors: their sandboxes were reaped if the machine
        came back (a live node with the same sandbox root reaped them), else they are left."""
        used = {loc["node"]: loc["sandbox_root"] for loc in located.values() if loc.get("node")}
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


def _reaped_here(base_dir: str) -> bool:
    """Whether the driver reaps its own node itself: a driver on the cluster (not a Ray
    client) and a sandbox root that names the same directory for every process of a
    machine (no ``~`` or ``$VARS``, which are expanded per node: a raylet's environment may
    set them; such roots are reaped by a task on each node)."""
    return "$" not in base_dir and not base_dir.startswith("~") and not ray.util.client.ray.is_connected()


def _in_thread(fn: Any, *args: Any) -> Future[Any]:
    """``fn(*args)`` in a daemon thread (the caller may have an event loop running; a reap
    stuck on a dead mount must not hold the process's exit, as an executor's thread would)."""
    fut: Future[Any] = Future()

    def run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller's, through the future
            fut.set_exception(exc)

    threading.Thread(target=run, name="farm-reap", daemon=True).start()
    return fut


def _reap_sandboxes(run_id: str, sandbox_cfg: Any, e2b_api_key: str | None,
                    skip_roots: list[str] | None = None) -> tuple[str, list[str] | None]:
    """Run as a Ray task on one node: (the sandbox root it looked in, the sandboxes it
    killed; None: the root is in ``skip_roots``, left alone)."""
    if sandbox_cfg.backend == "local":
        # heavy: the local sandbox backend, only when it is the one used
        from farm.sandboxes.local import reap, sandbox_root

        root = sandbox_root(sandbox_cfg.local)
        if root in (skip_roots or ()):
            return root, None
        return root, asyncio.run(reap(run_id, cfg=sandbox_cfg.local))
    if not e2b_api_key:
        return "", []
    # heavy: e2b, httpx, rich
    from farm.sandboxes.e2b import reap as reap_e2b

    return "", asyncio.run(reap_e2b(run_id, api_key=e2b_api_key, cfg=sandbox_cfg.e2b))
