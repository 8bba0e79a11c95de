"""Where the farm's actors run on a Ray cluster (``placement`` config).

- the reducer on the driver's node: it writes the output directory, which is the driver's;
- the router on a node holding ``placement.engine_resource`` (the GPU node), else anywhere;
- sandbox actors: ``placement.sandbox_actors_per_node`` pinned to each node holding
  ``placement.sandbox_resource`` (every alive node if unset), and to nodes that join
  mid-run (:class:`NodeWatch`); or ``ray.num_sandbox_actors`` spread over those nodes.

Node-pinned actors use ``NodeAffinitySchedulingStrategy(soft=False)``: when their node
dies they die with it (no restart elsewhere); the dispatch loop re-dispatches what they
held, and the surviving nodes' actors take it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from farm.config import PlacementConfig
from farm.errors import ConfigError

# A demand for a custom resource that selects the nodes holding it without limiting how
# many actors fit there (a node with `sandbox_node: 1` takes up to 1000 of them).
SLIVER = 0.001


def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def this_node() -> str:
    return ray.get_runtime_context().get_node_id()


def on_node(node_id: str) -> dict[str, Any]:
    """Actor options pinning it to ``node_id`` (and nowhere else, even on restart)."""
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}


def needing(resource: str | None) -> dict[str, Any]:
    return {"resources": {resource: SLIVER}} if resource else {}


def sandbox_nodes(placement: PlacementConfig) -> list[str]:
    """Alive nodes that run sandbox actors, in a stable order."""
    res = placement.sandbox_resource
    return sorted(n["NodeID"] for n in alive_nodes() if res is None or n.get("Resources", {}).get(res, 0) > 0)


def reducer_options() -> dict[str, Any]:
    return on_node(this_node())


def router_options(placement: PlacementConfig) -> dict[str, Any]:
    return needing(placement.engine_resource)


@dataclass(frozen=True)
class Slot:
    """Where one sandbox actor goes: ``node`` ('' = Ray chooses) and its actor options."""

    node: str
    options: dict[str, Any]


def sandbox_slots(placement: PlacementConfig, *, fixed: int | None, limit: int | None = None) -> list[Slot]:
    """The sandbox actors to start now: ``fixed`` spread over the sandbox nodes, else
    ``sandbox_actors_per_node`` on each (node by node, so ``limit`` still covers every node it can)."""
    if fixed is not None:
        slots = [Slot("", {"scheduling_strategy": "SPREAD", **needing(placement.sandbox_resource)})] * fixed
    else:
        nodes = sandbox_nodes(placement)
        if not nodes:
            raise ConfigError(f"no alive Ray node holds placement.sandbox_resource={placement.sandbox_resource!r}")
        slots = [Slot(node, on_node(node)) for _ in range(placement.sandbox_actors_per_node) for node in nodes]
    return slots[:limit] if limit is not None else slots


class NodeWatch:
    """Sandbox nodes that joined since the last look (at most every ``watch_nodes_s``)."""

    def __init__(self, placement: PlacementConfig, known: set[str]) -> None:
        self.placement = placement
        self.known = set(known)
        self._next = time.monotonic() + placement.watch_nodes_s

    def joined(self) -> list[str]:
        if not self.placement.watch_nodes_s or time.monotonic() < self._next:
            return []
        self._next = time.monotonic() + self.placement.watch_nodes_s
        new = [n for n in sandbox_nodes(self.placement) if n not in self.known]
        self.known.update(new)
        return new


def dead(nodes: set[str]) -> set[str]:
    """Those of ``nodes`` that are not alive now."""
    return nodes - {n["NodeID"] for n in alive_nodes()}
