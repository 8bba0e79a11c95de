"""Joining and leaving Ray, and the names of a run's actors there.

A run's actors are named ``farm-<run id>-<role>`` in the configured namespace: a sandbox
actor finds the reducer by name (so it survives reducer restarts), a test or an operator
finds an actor to kill by name, and an actor left by an earlier driver of the same run is
found and killed before its successor takes the name.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from farm.config import FarmConfig

log = logging.getLogger(__name__)


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


def kill_stale(name: str, namespace: str) -> None:
    """Kill the actor an earlier driver left under ``name`` (if any) and wait until the name is free."""
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
