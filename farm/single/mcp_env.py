"""``farm.Rollouts`` as an OpenEnv MCP environment (the ``openenv-core`` package, the
``openenv`` extra): an OpenEnv client (``openenv.core.mcp_client.MCPToolClient``) or
TRL's OpenEnv integration calls it unchanged.

Tools (the names the OpenEnv opencode environment uses)::

    run_rollout(task | inline, harness)      start, wait, finalize -> the result
    start_rollout(task | inline, harness)    -> the state (its id)
    subscribe_events(rollout_id, since, wait_s)
                                             the events after seq ``since`` (0: all; long poll: waits
                                             up to wait_s for the first new one); -> {events, next, done}
    get_state(rollout_id) · get_messages(rollout_id)
    abort_rollout(rollout_id) · finalize_rollout(rollout_id)

MCP tool calls are request/response, so ``subscribe_events`` is the long-poll form of
the SSE stream ``farm serve`` offers (same events, same sequence numbers). Every
client session gets its own environment object; all of them share the one service, so
a rollout started in one session can be watched from another.

The server (``farm serve --openenv``) mounts OpenEnv's app under ``/<token>``: OpenEnv's
client sends no auth header, so the base URL it is given (``http://127.0.0.1:PORT/<token>``)
is the credential; anything else is 404.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State
from fastapi import FastAPI

from farm.single.service import Rollouts

TOOLS = ("run_rollout", "start_rollout", "subscribe_events", "get_state", "get_messages", "abort_rollout",
         "finalize_rollout")  # fmt: skip
MAX_WAIT_S = 60.0


def _task_of(task: str | None, inline: dict[str, Any] | None) -> str | dict[str, Any]:
    if (task is None) == (inline is None):
        raise ValueError("give exactly one of 'task' (a task id) or 'inline' (a task object)")
    return task if task is not None else inline  # type: ignore[return-value]


def _handle(service: Rollouts, rollout_id: str) -> Any:
    try:
        return service.get(rollout_id)
    except KeyError:
        raise ValueError(f"unknown rollout {rollout_id!r}") from None


def build_mcp(service: Rollouts) -> FastMCP:
    mcp = FastMCP("farm-rollouts")

    @mcp.tool
    async def run_rollout(task: str | None = None, inline: dict[str, Any] | None = None,
                          harness: str | None = None) -> dict[str, Any]:
        """Run one rollout to its end and store it; returns status, reward, turns, tokens, diff, grading."""
        return await service.run(_task_of(task, inline), harness=harness)

    @mcp.tool
    async def start_rollout(task: str | None = None, inline: dict[str, Any] | None = None,
                            harness: str | None = None) -> dict[str, Any]:
        """Start one rollout; returns its state at once (``id`` names it in the other tools)."""
        return (await service.start(_task_of(task, inline), harness=harness)).state()

    @mcp.tool
    async def subscribe_events(rollout_id: str, since: int = 0, wait_s: float = 10.0) -> dict[str, Any]:
        """Events after seq ``since`` (the last one you have; 0: from the first), waiting up to
        wait_s for the first new one. Call again with ``since=next`` (the last seq returned)
        until ``done``; the last event is ``result``. Same numbering as SSE's Last-Event-ID."""
        events = await _handle(service, rollout_id).poll(max(0, since), min(max(wait_s, 0.0), MAX_WAIT_S))
        done = any(ev["kind"] == "result" for ev in events)
        return {"events": events, "next": events[-1]["seq"] if events else max(0, since), "done": done}

    @mcp.tool
    async def get_state(rollout_id: str) -> dict[str, Any]:
        """Phase, turns, tokens, elapsed, status (and the result once it ended)."""
        handle = _handle(service, rollout_id)
        return {**handle.state(), "result": handle.summary() if handle.done else None}

    @mcp.tool
    async def get_messages(rollout_id: str) -> list[dict[str, Any]]:
        """The canonical transcript so far (tool calls and results included)."""
        return await _handle(service, rollout_id).messages()

    @mcp.tool
    async def abort_rollout(rollout_id: str) -> dict[str, Any]:
        """End it now: status aborted, its sandbox closed, nothing stored."""
        return await _handle(service, rollout_id).abort()

    @mcp.tool
    async def finalize_rollout(rollout_id: str, keep_aborted: bool = False) -> dict[str, Any]:
        """Wait for its end, store its Samples and rollouts row; returns the result. An
        aborted rollout stores nothing unless keep_aborted (then untrainable)."""
        return await _handle(service, rollout_id).finalize(keep_aborted=keep_aborted)

    return mcp


class FarmRolloutsEnv(MCPEnvironment):
    """One OpenEnv client session over the shared service."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, service: Rollouts, tool_timeout_s: float = 3600.0) -> None:
        super().__init__(build_mcp(service))
        self.tool_timeout_s = tool_timeout_s  # OpenEnv's default (30 s) is shorter than one rollout
        self._state = State(episode_id=str(uuid.uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
        return Observation(done=False, reward=None, metadata={"tools": list(TOOLS)})

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        why = f"unsupported action {type(action).__name__}: call a tool ({', '.join(TOOLS)})"
        return Observation(done=False, reward=None, metadata={"error": why})

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and timeout_s is None:
            timeout_s = self.tool_timeout_s
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


def make_openenv_app(service: Rollouts, token: str, *, max_sessions: int = 64) -> Any:
    """The OpenEnv server app (FastAPI), mounted under ``/<token>``."""
    if not token or "/" in token:
        raise ValueError("the OpenEnv server needs a non-empty token without '/'")
    timeout = service.cfg.rollout.lifetime_s
    inner = create_fastapi_app(functools.partial(FarmRolloutsEnv, service, timeout), CallToolAction,
                               CallToolObservation, max_concurrent_envs=max_sessions)  # fmt: skip
    outer = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    outer.mount(f"/{token}", inner)
    return outer
