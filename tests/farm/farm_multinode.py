"""A real multi-node Ray cluster on this machine (``ray.cluster_utils.Cluster``): a head
(the driver's node, ``engine_node``) and worker nodes (``sandbox_node``), each a raylet
of its own with 1 logical CPU, its own temp dir and ports, and its own sandbox root.

A node's sandbox root: every node's raylet (so its workers) gets ``FARM_NODE_NAME``,
and configs use ``sandbox.local.base_dir: <root>/$FARM_NODE_NAME`` — expanded on the
node that creates the sandbox, as separate disks would be on a real cluster. A node
removed and added again under the same name finds its old root (a machine coming back).
"""

from __future__ import annotations

import atexit
import shutil
import socket
import threading
import time
import tempfile
from typing import Any
from unittest import mock

import ray
from ray.cluster_utils import Cluster

NODE_ENV = "FARM_NODE_NAME"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiNode:
    """Head + ``workers`` worker nodes; ``connect()`` makes this process the driver on the head."""

    def __init__(self, workers: int, *, head_resources: dict[str, float] | None = None,
                 worker_resources: dict[str, float] | None = None) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="frm")  # short: unix socket paths are limited
        self.worker_resources = worker_resources if worker_resources is not None else {"sandbox_node": 1}
        # Cluster() records its address in /tmp/ray/ray_current_cluster, where every plain
        # ray.init() on this machine (other tests, other sessions) would then join it: not here.
        with mock.patch.object(ray._private.utils, "write_ray_address", lambda *a, **k: None):
            self.cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "gcs_server_port": _free_port(), "temp_dir": self.temp_dir, "include_dashboard": False,
                "resources": head_resources if head_resources is not None else {"engine_node": 1},
                "env_vars": {NODE_ENV: "head"},
                # a killed node is declared dead in ~2 s, not ~15 s (a test cluster on loopback)
                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3},
            })
        self.nodes: dict[str, Any] = {}  # name -> ray Node (workers)
        for i in range(workers):
            self.add(f"w{i}")

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, name: str, resources: dict[str, float] | None = None) -> Any:
        """Start worker node ``name`` with ``resources`` (default: the sandbox node's), from
        any thread (a node joining while the farm runs)."""
        # A node's exit hooks install a SIGTERM handler, only possible on the main thread;
        # ``shutdown()`` (and our own atexit hook) stop it instead.
        hooks = threading.current_thread() is threading.main_thread()
        self.cluster._shutdown_at_exit = hooks
        try:
            node = self.cluster.add_node(num_cpus=1, env_vars={NODE_ENV: name},
                                         resources=self.worker_resources if resources is None else resources)
        finally:
            self.cluster._shutdown_at_exit = True
        if not hooks:
            atexit.register(node.kill_all_processes, check_alive=False, allow_graceful=False)
        self.nodes[name] = node
        return node

    def node_id(self, name: str) -> str:
        return self.head_id if name == "head" else self.nodes[name].node_id

    @property
    def head_id(self) -> str:
        return self.cluster.head_node.node_id

    def placed(self, prefix: str) -> dict[str, str]:
        """Actor name -> node id of every actor (alive or dead) named ``prefix...``, from the
        GCS actor table (no dashboard needed)."""
        from ray._private.state import actors

        return {a["Name"]: a["Address"]["NodeID"] for a in actors().values()
                if (a.get("Name") or "").startswith(prefix) and a.get("Address")}

    def kill(self, name: str, *, wait_dead_s: float = 0.0) -> None:
        """Kill every process of the node (raylet, its workers), no graceful shutdown; then
        wait (up to ``wait_dead_s``) until the cluster has declared it dead."""
        node = self.nodes.pop(name)
        self.cluster.remove_node(node, allow_graceful=False)
        deadline = time.monotonic() + wait_dead_s
        while time.monotonic() < deadline and any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
            time.sleep(0.2)  # poll: the loop's deadline bounds the wait

    def connect(self, namespace: str = "farm") -> None:
        ray.init(address=self.address, namespace=namespace, log_to_driver=False)

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # session logs, sockets
