"""Which sandbox actors take rollouts, as Ray answers it. ``farm.actors.pool.ActorPool``
decides (no Ray); this keeps the Ray refs its decisions wait on: the probe sent to an actor
that lost a rollout (it takes none until it answers, once per death), and the actors
starting on nodes that joined mid-run (they take rollouts once ready).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

import ray
from ray.exceptions import ActorUnavailableError, ActorUnschedulableError, RayActorError, RayTaskError

from farm.actors.pool import ActorPool, Health

# How long a control call (a probe, a lookup, a start) may take before it counts as failed.
CONTROL_TIMEOUT_S = 120.0
# An actor call failed because the actor is gone: dead, restarting, or pinned to a node
# that died (a node-pinned actor cannot restart anywhere else: unschedulable).
ACTOR_LOST = (RayActorError, ActorUnavailableError, ActorUnschedulableError)


class Notes(Protocol):
    def note(self, message: str) -> None: ...


class Membership:
    """The pool's actors, their probes and the actors joining."""

    def __init__(self, actors: dict[str, Any], pool: ActorPool, progress: Notes,
                 scale_out: Callable[[], dict[str, Any]] | None = None,
                 admit: Callable[[dict[str, str]], str | None] | None = None) -> None:  # fmt: skip
        self.actors = actors
        self.pool = pool
        self.progress = progress
        # New sandbox actors (nodes that joined mid-run): ``scale_out()`` starts them and gives
        # {name: ref ready when they are}; they join the pool once ready, unless ``admit(where)``
        # says why not (their gateway reached at another actor's URL: FarmActors.admit).
        self.scale_out = scale_out
        self.admit = admit
        self.probes: dict[Any, tuple[str, float]] = {}  # probe ref -> (actor, sent): actors that lost a rollout
        self.joining: dict[Any, str] = {}

    @property
    def refs(self) -> list[Any]:
        """What it waits on."""
        return [*self.probes, *self.joining]

    def owns(self, ref: Any) -> bool:
        return ref in self.probes or ref in self.joining

    def answered(self, ref: Any) -> None:
        """One of ``refs`` is ready."""
        if ref in self.probes:
            self._probed(ref)
        else:
            self._joined(ref)

    def grow(self) -> None:
        """Start the actors of nodes that joined (``scale_out``)."""
        if self.scale_out is None:
            return
        for name, ref in self.scale_out().items():
            self.joining[ref] = name

    def lost(self, name: str) -> None:
        """``name`` lost a rollout: no new ones for it until it answers a probe (once per death)."""
        self._carry_out(name, self.pool.lost(name))

    def guard(self, now: float) -> None:
        for ref, (name, sent) in list(self.probes.items()):
            if now - sent > CONTROL_TIMEOUT_S:  # restarting for too long: counts as one more death
                del self.probes[ref]
                self._carry_out(name, self.pool.probe_failed(name))

    def _joined(self, ref: Any) -> None:
        name = self.joining.pop(ref)
        try:
            where = ray.get(ref)
        except (*ACTOR_LOST, RayTaskError) as exc:
            self.progress.note(f"actor {name} did not start on its new node: {type(exc).__name__}")
            return
        refused = self.admit(where) if self.admit is not None else None
        if refused:
            self.progress.note(f"actor {name} takes no rollouts: {refused}")
            return
        self.pool.joined(name)
        self.progress.note(f"actor {name} joined on node {where.get('node', '')[:8]}: taking rollouts")

    def _carry_out(self, name: str, health: Health | None) -> None:
        if health is Health.PROBE:
            self.probes[self.actors[name].stats.remote()] = (name, time.monotonic())
        elif health is Health.RETIRED:
            self.progress.note(f"actor {name} keeps dying: no more rollouts for it")

    def _probed(self, ref: Any) -> None:
        name, _ = self.probes.pop(ref)
        try:
            ray.get(ref)
        except ACTOR_LOST:  # dead, or not back yet: ask again (bounded)
            self._carry_out(name, self.pool.probe_failed(name))
            return
        except RayTaskError:  # it runs code, so it is alive
            pass
        self.pool.probe_answered(name)
