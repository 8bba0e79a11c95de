"""``create_sandbox``: one entry point for every backend (implementations imported lazily)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from farm.errors import SandboxError
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.limiter import SandboxLimiter


def make_limiter(cfg: SandboxConfig) -> SandboxLimiter | None:
    """The limiter an actor should share across its sandboxes (E2B: rate + concurrency)."""
    if cfg.backend == "e2b":
        return SandboxLimiter(cfg.e2b.create_rate_per_s, cfg.e2b.create_burst, cfg.e2b.max_concurrent)
    return None


async def create_sandbox(
    cfg: SandboxConfig,
    spec: SandboxSpec,
    *,
    limiter: SandboxLimiter | None = None,
    e2b_api_key: str | None = None,
    limiter_timeout: float | None = None,
) -> Sandbox:
    """Create a sandbox of ``cfg.backend``. Close it (or use ``async with``) when done.

    With a ``limiter``, a concurrency slot is held until the sandbox is closed and each
    create waits for the create rate. ``e2b_api_key`` is required for the E2B backend
    (the entry point reads ``E2B_API_KEY``; library code never does).
    """
    slot = await limiter.acquire(limiter_timeout) if limiter is not None else None
    try:
        if cfg.backend == "local":
            from farm.sandboxes.local import LocalSandbox  # only the chosen backend loads

            sb = await LocalSandbox.create(cfg.local, spec, max_output_bytes=cfg.max_output_bytes)
        elif cfg.backend == "e2b":
            from farm.sandboxes.e2b import E2BSandbox  # optional extra: e2b

            if not e2b_api_key:
                raise SandboxError("the e2b sandbox backend needs an API key (set E2B_API_KEY for farm)")
            sb = await E2BSandbox.create(cfg.e2b, spec, api_key=e2b_api_key, max_output_bytes=cfg.max_output_bytes)
        else:  # pragma: no cover - the config's Literal forbids it
            raise SandboxError(f"unknown sandbox backend {cfg.backend!r}")
    except BaseException:
        if slot is not None:
            slot.release()
        raise
    if slot is not None:
        sb.add_close_callback(slot.release)
    return sb


@asynccontextmanager
async def open_sandbox(
    cfg: SandboxConfig,
    spec: SandboxSpec,
    *,
    limiter: SandboxLimiter | None = None,
    e2b_api_key: str | None = None,
    limiter_timeout: float | None = None,
) -> AsyncIterator[Sandbox]:
    """``async with open_sandbox(cfg, spec) as sb:`` -- closed on exit, even on error."""
    sb = await create_sandbox(cfg, spec, limiter=limiter, e2b_api_key=e2b_api_key, limiter_timeout=limiter_timeout)
    try:
        yield sb
    finally:
        await sb.close()
