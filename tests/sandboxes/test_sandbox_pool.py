"""SandboxPool: warm sandboxes per environment (farm.sandboxes.pool), on real local sandboxes.

Acquire/refill/bound/drain, a failed or used sandbox never handed out again, and two
rollouts sharing a pool never seeing each other's files (the workdir in the environment's
copy-on-write view, $HOME, /tmp).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.config import SandboxPoolConfig
from farm.sandboxes.pool import POOL_PURPOSE, SandboxPool, environment_key
from farm.sandboxes.views import SnapshotView, ViewLayer
from testkit.waits import async_wait_until


class Maker:
    """The pool's create callable: real local sandboxes, every one remembered."""

    def __init__(self, cfg: SandboxConfig, fail: int = 0) -> None:
        self.cfg = cfg
        self.made: list = []
        self.fail = fail  # the next N background (pool) creates raise

    async def __call__(self, spec: SandboxSpec):
        if self.fail and spec.labels.get("purpose") == POOL_PURPOSE:
            self.fail -= 1
            raise RuntimeError("create failed (test)")
        sb = await create_sandbox(self.cfg, spec)
        self.made.append(sb)
        return sb

    async def close_all(self) -> None:
        await asyncio.gather(*(sb.close() for sb in self.made), return_exceptions=True)


async def settled(pool: SandboxPool, idle: int, timeout: float = 20.0) -> None:
    await async_wait_until(lambda: pool.idle == idle and not any(e.making for e in pool._envs.values()),
                           timeout_s=timeout, what=f"the pool settled at {idle} idle")  # fmt: skip


def spec(rollout: str, env: str = "a", **kw) -> SandboxSpec:
    return SandboxSpec(labels={"run_id": "r", "rollout_id": rollout, "purpose": "agent"}, env={"ENV": env}, **kw)


async def test_acquire_refills_to_size_and_hands_each_sandbox_out_once(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=2))
    try:
        first = await pool.acquire(spec("r0"))  # nothing ready: created now, the pool starts filling
        assert pool.stats.misses == 1 and first.labels["rollout_id"] == "r0"
        await settled(pool, 2)
        assert len(make.made) == 3
        warm = [await pool.acquire(spec(f"r{i}")) for i in (1, 2)]
        assert pool.stats.hits == 2
        assert {sb.id for sb in warm} == {sb.id for sb in make.made} - {first.id}
        assert [sb.labels["rollout_id"] for sb in warm] == ["r1", "r2"]  # relabelled for its rollout
        assert all(sb.labels["purpose"] == "agent" for sb in warm)
        await settled(pool, 2)  # each hand-out refilled
        again = await pool.acquire(spec("r3"))
        assert again.id not in {first.id, *(sb.id for sb in warm)}  # never handed out twice
        assert (await again.exec(["true"])).ok
        for sb in [first, *warm, again]:
            await sb.close()
        await settled(pool, 2)
        assert pool.idle == 2  # closing used sandboxes gives nothing back to the pool
    finally:
        await pool.close()
        await make.close_all()


async def test_pool_is_bounded_per_environment_and_in_environments(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=1, max_environments=2))
    try:
        for env in ("a", "b"):
            await (await pool.acquire(spec("x", env))).close()
        await settled(pool, 2)
        waiting = [i.sandbox for e in pool._envs.values() for i in e.idle]
        assert all(sb.labels["purpose"] == POOL_PURPOSE and "rollout_id" not in sb.labels for sb in waiting)
        await (await pool.acquire(spec("x", "c"))).close()  # a third environment: a's pool is drained
        await settled(pool, 2)
        assert list(pool._envs) == [environment_key(spec("", "b")), environment_key(spec("", "c"))]
        assert waiting[0].closed and not waiting[1].closed
        assert len(make.made) == 6  # 3 cold + one per environment, never more than size
    finally:
        await pool.close()
        await make.close_all()


async def test_close_drains_and_later_acquires_create_cold(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=2))
    await (await pool.acquire(spec("r0"))).close()
    await settled(pool, 2)
    await pool.close()
    assert pool.idle == 0 and all(sb.closed for sb in make.made)
    sb = await pool.acquire(spec("r1"))
    try:
        assert not sb.closed and len(make.made) == 4
        await asyncio.sleep(0.1)  # a window for a refill that must not come
        assert len(make.made) == 4  # a closed pool refills nothing
    finally:
        await sb.close()


async def test_a_failed_sandbox_is_never_handed_out(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=3))
    try:
        await (await pool.acquire(spec("r0"))).close()
        await settled(pool, 3)
        broken, breached, good = (i.sandbox for i in pool._envs[environment_key(spec(""))].idle)
        await broken.close()  # closed under the pool (its lifetime, a crash): forgotten at once
        assert pool.idle == 2
        breached._watchdog.breaches["disk"] = "disk limit exceeded (test)"
        got = await pool.acquire(spec("r1"))
        assert got is good and pool.stats.discarded == 1
        await async_wait_until(lambda: breached.closed, timeout_s=10, what="the breached sandbox closed (in the background)")
        await got.close()
    finally:
        await pool.close()
        await make.close_all()


async def test_stale_sandboxes_are_closed_not_handed_out(local_cfg: SandboxConfig) -> None:
    now = [0.0]
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=1, max_idle_s=60), clock=lambda: now[0])
    try:
        await (await pool.acquire(spec("r0"))).close()
        await settled(pool, 1)
        stale = pool._envs[environment_key(spec(""))].idle[0].sandbox
        now[0] = 61.0
        got = await pool.acquire(spec("r1"))
        assert got is not stale and pool.stats.misses == 2
        await async_wait_until(lambda: stale.closed, timeout_s=10, what="the stale sandbox closed (in the background)")
        await got.close()
    finally:
        await pool.close()
        await make.close_all()


async def test_a_failed_refill_pauses_until_the_next_acquire(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=2, refill_concurrency=1))
    try:
        make.fail = 1  # the first background create fails: no retry storm, nothing half-made kept
        first = await pool.acquire(spec("r0"))
        await settled(pool, 0)
        await asyncio.sleep(0.1)  # a window for a retry that must not come
        assert pool.stats.failed == 1 and pool.idle == 0 and len(make.made) == 1
        await first.close()
        await (await pool.acquire(spec("r1"))).close()  # the next acquire resumes refilling
        await settled(pool, 2)
        assert pool.stats.made == 2
    finally:
        await pool.close()
        await make.close_all()


async def test_a_miss_makes_room_when_the_limit_is_reached(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    full = [False]
    pool = SandboxPool(make, SandboxPoolConfig(size=1), has_room=lambda: not full[0])
    try:
        await (await pool.acquire(spec("x", "a"))).close()
        await settled(pool, 1)
        idle_a = pool._envs[environment_key(spec("", "a"))].idle[0].sandbox
        full[0] = True  # the live-sandbox cap is reached: a's idle sandbox gives its slot to b's rollout
        got = await pool.acquire(spec("y", "b"))
        assert idle_a.closed and pool.idle == 0
        await asyncio.sleep(0.1)  # a window for a refill that must not come
        assert len(make.made) == 3  # and no refill takes a slot while there is no room
        await got.close()
    finally:
        await pool.close()
        await make.close_all()


async def test_rollouts_sharing_a_pool_never_see_each_others_files(local_cfg: SandboxConfig, tmp_path: Path) -> None:
    lower = tmp_path / "env"
    (lower / "repo").mkdir(parents=True)
    (lower / "repo" / "code.py").write_text("x = 1\n")
    view = SnapshotView(key="env", layers=(ViewLayer(path=str(lower)),), mount="/workspace")
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=2))
    try:
        await (await pool.acquire(spec("warmup", view=view))).close()
        await settled(pool, 2)
        a = await pool.acquire(spec("a", view=view))
        write = "echo a > /workspace/repo/code.py && echo a > /workspace/repo/new.txt && echo a > $HOME/h && echo a > /tmp/t"
        assert (await a.exec(write)).ok
        await a.close()
        b = await pool.acquire(spec("b", view=view))
        assert pool.stats.hits == 2 and b.id != a.id
        seen = await b.exec("cat /workspace/repo/code.py; ls -A /workspace/repo; "
                            "for f in /workspace/repo/new.txt $HOME/h /tmp/t; do test -e $f && echo $f; done; true")
        assert seen.ok and seen.stdout.split() == ["x", "=", "1", "code.py"]
        assert (lower / "repo" / "code.py").read_text() == "x = 1\n"  # the snapshot itself untouched
        await b.close()
    finally:
        await pool.close()
        await make.close_all()


async def test_size_zero_is_no_pool(local_cfg: SandboxConfig) -> None:
    make = Maker(local_cfg)
    pool = SandboxPool(make, SandboxPoolConfig(size=0))
    sb = await pool.acquire(spec("r0"))
    await asyncio.sleep(0.1)  # a window for a refill that must not come
    assert len(make.made) == 1 and pool.idle == 0 and pool.stats.misses == 0
    await sb.close()
    await pool.close()
