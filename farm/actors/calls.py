"""Calling a farm actor's method the same way whatever holds it: a Ray actor handle, a
named Ray actor (resolved with ``ray.get_actor``), or the plain object itself (the same
actor classes run in-process in tests and ``farm.single``'s ``InProcess``)."""

from __future__ import annotations

import asyncio
from typing import Any


def resolve(handle: Any) -> Any:
    """The actor behind ``handle``: a name is looked up in Ray (a blocking call to Ray's GCS:
    callers that call often resolve once and keep what this returns)."""
    if isinstance(handle, str):
        # heavy: ray
        import ray

        return ray.get_actor(handle)
    return handle


async def call(handle: Any, method: str, *args: Any) -> Any:
    """Call ``method`` on a Ray actor handle (or a named actor), or on a plain object (in-process tests)."""
    fn = getattr(resolve(handle), method)
    remote = getattr(fn, "remote", None)
    if remote is not None:
        return await remote(*args)
    result = fn(*args)
    return await result if asyncio.iscoroutine(result) else result
