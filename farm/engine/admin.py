"""Control-plane calls on SGLang workers and the sglang-router, with typed results.

The router (0.3.x) manages workers with ``GET /workers``, ``POST /workers {url}`` and
``DELETE /workers/{id}`` (both 202: queued, so callers poll ``GET /workers``). It
does not forward ``/update_weights_from_disk`` or ``/abort_request``: those go to each
worker directly.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from pydantic import BaseModel, Field

from farm.errors import EngineError, EngineTimeout


class WorkerInfo(BaseModel):
    url: str
    id: str | None = Field(default=None, description="the router's worker id (None outside a router)")
    healthy: bool = True
    load: int | None = None


class EngineHealth(BaseModel):
    healthy: bool
    reason: str = ""
    mode: str
    url: str | None
    workers: list[WorkerInfo] = Field(default_factory=list)
    policy_version: int = 0


class WeightUpdate(BaseModel):
    policy_version: int
    model_path: str
    messages: dict[str, str] = Field(default_factory=dict, description="worker url -> its answer")


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


async def _request(session: aiohttp.ClientSession, method: str, url: str, *, timeout: float,
                   json: Any = None) -> tuple[int, Any]:
    try:
        async with session.request(method, url, json=json, timeout=_timeout(timeout)) as resp:
            text = await resp.text()
            try:
                body: Any = await resp.json(content_type=None) if text else None
            except ValueError:
                body = text
            return resp.status, body
    except asyncio.TimeoutError as exc:
        raise EngineTimeout(f"{method} {url}: no answer within {timeout:.0f}s") from exc
    except aiohttp.ClientError as exc:
        raise EngineError(f"{method} {url}: {exc}") from exc


async def is_healthy(session: aiohttp.ClientSession, url: str, *, timeout: float) -> bool:
    try:
        status, _ = await _request(session, "GET", url.rstrip("/") + "/health", timeout=timeout)
    except EngineError:
        return False
    return status == 200


async def router_workers(session: aiohttp.ClientSession, router_url: str, *, timeout: float) -> list[WorkerInfo]:
    status, body = await _request(session, "GET", router_url + "/workers", timeout=timeout)
    if status != 200 or not isinstance(body, dict):
        raise EngineError(f"GET {router_url}/workers -> {status}: {body!r}")
    return [WorkerInfo(url=w["url"], id=w.get("id"), healthy=bool(w.get("is_healthy", False)), load=w.get("load"))
            for w in body.get("workers", [])]


async def router_add_worker(session: aiohttp.ClientSession, router_url: str, worker_url: str, *,
                            timeout: float) -> WorkerInfo:
    """Register ``worker_url`` and wait until the router lists it as healthy."""
    status, body = await _request(session, "POST", router_url + "/workers", json={"url": worker_url},
                                  timeout=timeout)
    if status not in (200, 201, 202):
        raise EngineError(f"router refused worker {worker_url}: {status} {body!r}")
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        for w in await router_workers(session, router_url, timeout=timeout):
            if w.url == worker_url and w.healthy:
                return w
        if asyncio.get_running_loop().time() >= deadline:
            raise EngineTimeout(f"router did not activate worker {worker_url} within {timeout:.0f}s")
        await asyncio.sleep(0.1)


async def router_remove_worker(session: aiohttp.ClientSession, router_url: str, worker_url: str, *,
                               timeout: float) -> None:
    """Deregister ``worker_url`` and wait until the router no longer lists it."""
    workers = await router_workers(session, router_url, timeout=timeout)
    match = [w for w in workers if w.url == worker_url]
    if not match:
        return
    status, body = await _request(session, "DELETE", f"{router_url}/workers/{match[0].id}", timeout=timeout)
    if status not in (200, 202, 204):
        raise EngineError(f"router refused to remove {worker_url}: {status} {body!r}")
    deadline = asyncio.get_running_loop().time() + timeout
    while any(w.url == worker_url for w in await router_workers(session, router_url, timeout=timeout)):
        if asyncio.get_running_loop().time() >= deadline:
            raise EngineTimeout(f"router still lists {worker_url} after {timeout:.0f}s")
        await asyncio.sleep(0.1)


async def update_weights_from_disk(session: aiohttp.ClientSession, worker_url: str, model_path: str,
                                   weight_version: str, *, timeout: float) -> str:
    """SGLang's ``POST /update_weights_from_disk``; returns the worker's message."""
    status, body = await _request(session, "POST", worker_url + "/update_weights_from_disk", timeout=timeout,
                                  json={"model_path": model_path, "weight_version": weight_version})
    ok = status == 200 and isinstance(body, dict) and body.get("success", False)
    if not ok:
        raise EngineError(f"{worker_url}: update_weights_from_disk failed ({status}): {body!r}")
    return str(body.get("message", ""))


async def update_weight_version(session: aiohttp.ClientSession, worker_url: str, weight_version: str, *,
                                timeout: float) -> str:
    """SGLang's ``POST /update_weight_version``: the trainer loaded the weights itself
    (NCCL / tensors); the worker only stamps the new version on later replies."""
    status, body = await _request(session, "POST", worker_url + "/update_weight_version", timeout=timeout,
                                  json={"new_version": weight_version, "abort_all_requests": False})
    if status != 200 or (isinstance(body, dict) and body.get("success") is False):
        raise EngineError(f"{worker_url}: update_weight_version failed ({status}): {body!r}")
    return str(body.get("message", "")) if isinstance(body, dict) else str(body or "")


async def pause_generation(session: aiohttp.ClientSession, worker_url: str, mode: str, *, timeout: float) -> None:
    """SGLang's ``POST /pause_generation {mode}`` (``retract``: running requests go back to
    the queue and are recomputed after ``continue``; ``in_place``; ``abort``)."""
    status, body = await _request(session, "POST", worker_url + "/pause_generation", timeout=timeout,
                                  json={"mode": mode})
    if status != 200:
        raise EngineError(f"{worker_url}: pause_generation({mode}) failed ({status}): {body!r}")


async def continue_generation(session: aiohttp.ClientSession, worker_url: str, *, timeout: float) -> None:
    status, body = await _request(session, "POST", worker_url + "/continue_generation", timeout=timeout, json={})
    if status != 200:
        raise EngineError(f"{worker_url}: continue_generation failed ({status}): {body!r}")
