"""SandboxPool: warm sandboxes per environment, made ahead of the rollouts that need them.

A rollout's sandbox costs a create (local: its directories, cgroup, copy-on-write view
of the environment snapshot and a first jailed command; E2B: an API round trip) before
the agent can start. The pool keeps up to ``size`` ready sandboxes per *environment*
(every field of the ``SandboxSpec`` but its labels: image, env, lifetime, the read-only
binds that show the harness CLI and the task's interpreter, the snapshot view), hands
one out on ``acquire`` and makes its replacement in the background.

Rules that keep it safe:

- a sandbox is handed out at most once: the rollout owns it from then on and closes it;
  nothing is ever given back to the pool, so one rollout's files are never seen by the next;
- a sandbox that failed (closed under the pool, a limit breached, idle longer than
  ``max_idle_s`` so that its lifetime is being spent) is closed, never handed out;
- bounded: ``size`` per environment, ``max_environments`` environments (least recently
  used first out), ``refill_concurrency`` background creates at once; a failed refill
  stops that environment's refilling until its next ``acquire`` (no retry storm);
- a miss (nothing ready) creates cold, as without a pool: the pool never makes a rollout
  wait for a sandbox it is still making for someone else;
- ``close()`` cancels the refills and closes every idle sandbox.

Idle sandboxes are live sandboxes: they count against the actor's create limiter (its
live-sandbox cap) and, on E2B, against the plan's concurrency and its bill. When the
limiter is full, a miss first closes idle sandboxes of other environments (``make_room``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.sandboxes.config import SandboxPoolConfig

log = logging.getLogger(__name__)

POOL_PURPOSE = "pool"  # the ``purpose`` label of a sandbox while it waits in the pool


def environment_key(spec: SandboxSpec) -> str:
    """What makes two specs interchangeable: every field but the labels."""
    return spec.model_dump_json(exclude={"labels"})


@dataclass
class _Idle:
    sandbox: Sandbox
    made_at: float


@dataclass
class _Env:
    spec: SandboxSpec
    idle: list[_Idle] = field(default_factory=list)
    making: int = 0
    refill: asyncio.Task[None] | None = None
    paused: bool = False  # a refill failed: wait for the next acquire


@dataclass
class PoolStats:
    hits: int = 0
    misses: int = 0
    made: int = 0
    failed: int = 0
    discarded: int = 0  # idle sandboxes closed unused (stale, broken, evicted, drained)


class SandboxPool:
    """``await pool.acquire(spec)``: a warm sandbox for ``spec``'s environment, or a new one.

    ``create(spec)`` makes a sandbox (the caller's own create path: limiter, metrics,
    bookkeeping). ``has_room()`` says whether a background create may take a live slot
    now (e.g. the limiter has a free one); default: always.
    """

    def __init__(
        self,
        create: Callable[[SandboxSpec], Awaitable[Sandbox]],
        cfg: SandboxPoolConfig,
        *,
        has_room: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._create = create
        self.cfg = cfg
        self._has_room = has_room
        self._clock = clock
        self._envs: OrderedDict[str, _Env] = OrderedDict()
        self._makers = asyncio.Semaphore(cfg.refill_concurrency)
        self._closed = False
        self.stats = PoolStats()

    @property
    def idle(self) -> int:
        return sum(len(e.idle) for e in self._envs.values())

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        """A sandbox for ``spec`` (labels set to ``spec.labels``); the caller closes it."""
        if self._closed or self.cfg.size == 0:
            return await self._create(spec)
        key = environment_key(spec)
        env = self._envs.get(key)
        if env is None:
            env = self._envs[key] = _Env(spec=spec.model_copy(update={"labels": _pool_labels(spec)}))
            await self._evict_beyond_bound()
        self._envs.move_to_end(key)
        env.paused = False
        sb = self._take(env)
        self._start_refill(key, env)
        if sb is not None:
            self.stats.hits += 1
            sb.labels = dict(spec.labels)
            return sb
        self.stats.misses += 1
        if not self._has_room():  # idle sandboxes of other environments hold the live slots
            await self.make_room(keep=spec)
        return await self._create(spec)

    def _take(self, env: _Env) -> Sandbox | None:
        now = self._clock()
        while env.idle:
            item = env.idle.pop(0)  # oldest first: its lifetime is the most spent
            if now - item.made_at <= self.cfg.max_idle_s and _usable(item.sandbox):
                return item.sandbox
            self._discard(item.sandbox)
        return None

    async def make_room(self, keep: SandboxSpec | None = None) -> int:
        """Close the idle sandboxes of every environment but ``keep``'s (the least
        recently used first); returns how many. Call it when a create waits for a slot."""
        keep_key = environment_key(keep) if keep is not None else None
        closing = []
        for key, env in self._envs.items():
            if key != keep_key:
                closing += [i.sandbox for i in env.idle]
                env.idle.clear()
        self.stats.discarded += len(closing)
        await asyncio.gather(*(sb.close() for sb in closing), return_exceptions=True)
        return len(closing)

    async def close(self) -> None:
        """Stop refilling and close every idle sandbox. Idempotent."""
        self._closed = True
        tasks = [e.refill for e in self._envs.values() if e.refill is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        closing = [i.sandbox for e in self._envs.values() for i in e.idle]
        self._envs.clear()
        self.stats.discarded += len(closing)
        await asyncio.gather(*(sb.close() for sb in closing), return_exceptions=True)

    # --- refilling -------------------------------------------------------------
    def _start_refill(self, key: str, env: _Env) -> None:
        if env.refill is None or env.refill.done():
            env.refill = asyncio.ensure_future(self._refill(key, env))

    async def _refill(self, key: str, env: _Env) -> None:
        """Make sandboxes until ``size`` are ready (or in the making), ``refill_concurrency`` at once."""
        makers: set[asyncio.Task[None]] = set()

        def wanted() -> bool:
            live = not self._closed and not env.paused and self._envs.get(key) is env
            return live and len(env.idle) + env.making < self.cfg.size and self._has_room()

        try:
            while True:
                if not wanted():
                    if not makers or env.paused or self._closed:
                        break
                    await asyncio.wait(makers, return_when=asyncio.FIRST_COMPLETED)
                    makers = {m for m in makers if not m.done()}
                    continue
                await self._makers.acquire()
                if not wanted():  # things changed while waiting for a turn (a create failed, ...)
                    self._makers.release()
                    continue
                env.making += 1
                makers.add(asyncio.ensure_future(self._make_one(key, env)))
            await asyncio.gather(*makers, return_exceptions=True)
        except asyncio.CancelledError:
            for m in makers:
                m.cancel()
            await asyncio.gather(*makers, return_exceptions=True)
            raise

    async def _make_one(self, key: str, env: _Env) -> None:
        try:
            sb = await self._create(env.spec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed refill only pauses this environment's pool
            self.stats.failed += 1
            env.paused = True
            log.warning("sandbox pool: a background create failed (refilling paused until the next acquire): %s", exc)
            return
        finally:
            env.making -= 1
            self._makers.release()
        self.stats.made += 1
        if self._closed or self._envs.get(key) is not env:
            self._discard(sb)
            return
        env.idle.append(_Idle(sb, self._clock()))
        sb.add_close_callback(lambda: _forget(env, sb))  # closed under the pool: never handed out

    async def _evict_beyond_bound(self) -> None:
        while len(self._envs) > self.cfg.max_environments:
            _, old = self._envs.popitem(last=False)
            if old.refill is not None:
                old.refill.cancel()
            closing = [i.sandbox for i in old.idle]
            old.idle.clear()
            self.stats.discarded += len(closing)
            await asyncio.gather(*(sb.close() for sb in closing), return_exceptions=True)

    def _discard(self, sb: Sandbox) -> None:
        self.stats.discarded += 1
        task = asyncio.ensure_future(sb.close())
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


def _pool_labels(spec: SandboxSpec) -> dict[str, str]:
    """A waiting sandbox belongs to the run, to no rollout yet."""
    return {k: v for k, v in spec.labels.items() if k == "run_id"} | {"purpose": POOL_PURPOSE}


def _usable(sb: Any) -> bool:
    """Not closed (by its lifetime, a failure, anyone) and no limit breached."""
    if getattr(sb, "closed", False):
        return False
    try:
        return not sb.breaches
    except Exception:  # noqa: BLE001 - a sandbox that cannot say is not handed out
        return False


def _forget(env: _Env, sb: Sandbox) -> None:
    env.idle[:] = [i for i in env.idle if i.sandbox is not sb]
