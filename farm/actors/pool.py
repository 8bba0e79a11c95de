"""ActorPool: which sandbox actors may take a rollout now, and how loaded each is.

The dispatcher's bookkeeping of actor health, apart from its Ray loop (no Ray here):
an actor that lost a rollout takes no new ones until it answers a probe (Ray restarts
it, ``ray.actor_max_restarts``), or it is dead for good (restarts used up, ``ray.kill``,
its node gone) and is retired. Without the probe the dead actor would be the least
loaded one and take every re-dispatch, each failing at once. Actors started on nodes
that join mid-run enter the pool once ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum


def pick_actor(inflight: Mapping[str, int], capacity: int, prefer: str | None = None) -> str | None:
    """``prefer`` when it has a free slot (the actor whose node already holds the task's
    environment snapshot: see farm.envs), else the least-loaded actor with a free slot
    (ties: first in order), or None (backpressure)."""
    if prefer is not None and inflight.get(prefer, capacity) < capacity:
        return prefer
    best: str | None = None
    for name, n in inflight.items():
        if n < capacity and (best is None or n < inflight[best]):
            best = name
    return best


class Health(str, Enum):
    """What the dispatcher does about an actor that lost a rollout (or a probe)."""

    PROBE = "probe"  # send it one probe; it takes nothing until the probe answers
    PROBING = "probing"  # a probe is already out (the same death seen again): nothing to do
    RETIRED = "retired"  # it died more than max_deaths times: out of the pool for good (just now)


class ActorPool:
    """Load per alive actor (at most ``capacity`` rollouts each), probes, retirements."""

    def __init__(self, names: Iterable[str], *, capacity: int, max_deaths: int) -> None:
        self.capacity = capacity
        self.max_deaths = max_deaths  # ray.actor_max_restarts + 1: the deaths Ray can bring it back from
        self.load: dict[str, int] = {name: 0 for name in names}  # alive actors (probing ones included)
        self.deaths: dict[str, int] = dict.fromkeys(self.load, 0)
        self.probing: set[str] = set()

    @property
    def alive(self) -> list[str]:
        return list(self.load)

    @property
    def empty(self) -> bool:
        """No actor left to run anything."""
        return not self.load

    @property
    def free_slots(self) -> int:
        """Rollouts the actors that take work now could start."""
        return sum(max(0, self.capacity - n) for name, n in self.load.items() if name not in self.probing)

    def pick(self, prefer: str | None = None) -> str | None:
        """The actor for the next rollout (``prefer`` while it has room), or None: backpressure."""
        takers = {name: n for name, n in self.load.items() if name not in self.probing}
        return pick_actor(takers, self.capacity, prefer=prefer)

    def took(self, name: str) -> None:
        self.load[name] += 1

    def freed(self, name: str) -> None:
        if name in self.load:  # a retired actor's last rollouts come back too
            self.load[name] -= 1

    def lost(self, name: str) -> Health | None:
        """``name`` lost a rollout: counted once per death (None: not in the pool any more)."""
        if name not in self.load:
            return None
        if name in self.probing:
            return Health.PROBING
        return self._died(name)

    def probe_failed(self, name: str) -> Health | None:
        """Its probe found it dead, not back yet, or did not answer in time: one more death."""
        self.probing.discard(name)
        if name not in self.load:
            return None
        return self._died(name)

    def probe_answered(self, name: str) -> None:
        """It runs code again: it takes rollouts."""
        self.probing.discard(name)

    def joined(self, name: str) -> None:
        """A new actor (a node that joined mid-run) is ready."""
        self.load[name] = 0
        self.deaths[name] = 0
        self.probing.discard(name)

    def _died(self, name: str) -> Health:
        self.deaths[name] += 1
        if self.deaths[name] > self.max_deaths:
            del self.load[name]
            return Health.RETIRED
        self.probing.add(name)
        return Health.PROBE
