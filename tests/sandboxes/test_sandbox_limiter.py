"""SandboxLimiter / TokenBucket with a fake clock: the policy, without waiting."""

from __future__ import annotations

import asyncio

import pytest

from farm.errors import SandboxError
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.factory import create_sandbox, make_limiter
from farm.sandboxes.limiter import SandboxLimiter, TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def test_token_bucket_burst_then_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    assert [bucket.try_take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.try_take() == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.try_take() == 0.0
    clock.now += 100  # refills only up to the burst
    assert [bucket.try_take() for _ in range(4)][-1] > 0
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1)


async def test_limiter_spaces_creates_at_the_rate() -> None:
    clock = FakeClock()
    lim = SandboxLimiter(rate=2.0, burst=1, max_concurrent=10, clock=clock, sleep=clock.sleep)
    stamps = []
    for _ in range(5):
        await lim.acquire()
        stamps.append(clock.now)
    assert stamps == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0])
    assert lim.in_use == 5


async def test_limiter_caps_concurrency_until_release() -> None:
    clock = FakeClock()
    lim = SandboxLimiter(rate=1000.0, burst=10, max_concurrent=2, clock=clock, sleep=clock.sleep)
    a = await lim.acquire()
    await lim.acquire()
    third = asyncio.create_task(lim.acquire())
    await asyncio.sleep(0.01)  # a window in which the third must not get a slot
    assert not third.done()
    a.release()
    a.release()  # idempotent: frees one slot only
    slot = await asyncio.wait_for(third, 5)
    assert lim.in_use == 2
    with pytest.raises(SandboxError, match="no create slot within"):
        await lim.acquire(timeout=0.05)
    slot.release()
    assert lim.in_use == 1


async def test_factory_holds_a_slot_per_live_sandbox(local_cfg: SandboxConfig) -> None:
    lim = SandboxLimiter(rate=1000.0, burst=10, max_concurrent=1)
    sb = await create_sandbox(local_cfg, SandboxSpec(), limiter=lim)
    assert lim.in_use == 1
    with pytest.raises(SandboxError):
        await create_sandbox(local_cfg, SandboxSpec(), limiter=lim, limiter_timeout=0.05)
    await sb.close()
    await sb.close()
    assert lim.in_use == 0
    # a failed create gives its slot back
    bad = local_cfg.model_copy(update={"local": local_cfg.local.model_copy(update={"bwrap_path": "/nope"})})
    with pytest.raises(SandboxError):
        await create_sandbox(bad, SandboxSpec(), limiter=lim)
    assert lim.in_use == 0


def test_make_limiter_follows_the_e2b_section() -> None:
    assert make_limiter(SandboxConfig()) is None
    lim = make_limiter(SandboxConfig(backend="e2b", e2b={"max_concurrent": 7}))
    assert lim is not None and lim.max_concurrent == 7
