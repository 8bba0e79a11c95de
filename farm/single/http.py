"""``farm serve``: ``farm.Rollouts`` as a small REST API with server-sent events.

::

    POST /rollouts                  {"task": "demo-wordfreq", "harness": "claude_code"}
                                    or {"inline": {instruction, files, setup, verifier}}  -> 201 state
    GET  /rollouts?status=running   states of every rollout of this server
    GET  /rollouts/{id}             state (and the result, once it ended)
    GET  /rollouts/{id}/events      SSE: one event per phase / turn / tool call / output line,
                                    the last one is ``result``; ``id:`` = the event's seq (1, 2, ...)
    GET  /health                    liveness, no token needed: 200 {"status": "ok"} while the
                                    service runs, 503 {"status": "stopped"} otherwise
    GET  /rollouts/{id}/messages    the canonical transcript so far
    POST /rollouts/{id}/abort       -> the result (status aborted; nothing stored)
    POST /rollouts/{id}/finalize    waits for the end, stores Samples + row -> the result
                                    ({"keep_aborted": true}: an aborted one's row too, untrainable)

Every request but ``/health`` needs ``Authorization: Bearer <token>`` (401 otherwise):
``/health`` says only that the process answers (for a load balancer's or Kubernetes'
probe, which carry no token), nothing about any rollout. Errors are JSON
``{"error": {"type", "message"}}`` with a 4xx status; a bad body loses nothing.

Resuming an event stream: ``Last-Event-ID: N`` (what a browser's EventSource sends when it
reconnects) and ``?since=N`` mean the same, SSE's meaning: N is the last event the client
has, the stream starts after it (0 or neither: from the first). When both are given the
header wins (a reconnecting EventSource keeps its original URL).
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError, model_validator

from farm.errors import ConfigError, TaskError
from farm.single.service import Rollouts

log = logging.getLogger(__name__)

ROLLOUTS_KEY: web.AppKey[Rollouts] = web.AppKey("rollouts", Rollouts)
BODY_LIMIT = 8 << 20  # an inline task's files travel in the body


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status)


class HttpError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def _auth_middleware(token: str) -> Any:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode()
        if request.path != "/health" and not hmac.compare_digest(given, expected):
            return _error(401, "authentication", "missing or wrong bearer token (Authorization: Bearer <token>)")
        try:
            return await handler(request)
        except HttpError as exc:
            return _error(exc.status, exc.kind, str(exc))
        except (TaskError, ConfigError) as exc:
            return _error(400, "invalid_request", str(exc))
        except web.HTTPException as exc:  # no such route, method not allowed, body too large
            if exc.status < 400:
                raise
            return _error(exc.status, "invalid_request", exc.reason)

    return auth


def _handle(request: web.Request) -> Any:
    rid = request.match_info["id"]
    try:
        return request.app[ROLLOUTS_KEY].get(rid)
    except KeyError:
        raise HttpError(404, "not_found", f"unknown rollout {rid!r}") from None


class CreateRequest(BaseModel):
    """``POST /rollouts``: a task of the service's task set by id, or one given inline."""

    model_config = ConfigDict(extra="forbid")

    task: StrictStr | None = Field(default=None, description="a task id")
    inline: dict[str, Any] | None = Field(default=None, description="a task object (instruction, files, setup, "
                                          "verifier): farm.single.inline checks it")
    harness: StrictStr | None = Field(default=None, description="the CLI to run (default: the service's)")

    @model_validator(mode="after")
    def _one_task(self) -> CreateRequest:
        if (self.task is None) == (self.inline is None):
            raise ValueError("give exactly one of 'task' (a task id) or 'inline' (a task object)")
        return self


class FinalizeRequest(BaseModel):
    """``POST /rollouts/{id}/finalize`` (the body is optional)."""

    model_config = ConfigDict(extra="forbid")

    keep_aborted: StrictBool = Field(default=False, description="store an aborted rollout's row too (untrainable)")


M = TypeVar("M", bound=BaseModel)


def _parsed(model: type[M], body: dict[str, Any]) -> M:
    """``body`` as ``model``, or a 400 naming every field that is wrong."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown field {where!r}")
            else:
                problems.append(f"{where}: {err['msg']}" if where else err["msg"].removeprefix("Value error, "))
        raise HttpError(400, "invalid_request", "; ".join(problems)) from None


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_type != "application/json":
        raise HttpError(415, "unsupported_media",
                        f"Content-Type must be application/json, got {request.content_type!r}")
    try:
        body = json.loads(await request.text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise HttpError(400, "invalid_json", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "invalid_request", "body must be a JSON object")
    return body


async def create(request: web.Request) -> web.Response:
    req = _parsed(CreateRequest, await _body(request))
    handle = await request.app[ROLLOUTS_KEY].start(req.task if req.task is not None else req.inline, harness=req.harness)
    return web.json_response(handle.state(), status=201)


async def listing(request: web.Request) -> web.Response:
    return web.json_response({"rollouts": request.app[ROLLOUTS_KEY].list(request.query.get("status"))})


async def state(request: web.Request) -> web.Response:
    handle = _handle(request)
    return web.json_response({**handle.state(), "result": handle.summary() if handle.done else None})


async def messages(request: web.Request) -> web.Response:
    return web.json_response({"messages": await _handle(request).messages()})


async def abort(request: web.Request) -> web.Response:
    return web.json_response(await _handle(request).abort())


async def finalize(request: web.Request) -> web.Response:
    handle = _handle(request)
    req = _parsed(FinalizeRequest, await _body(request) if request.can_read_body else {})
    return web.json_response(await handle.finalize(keep_aborted=req.keep_aborted))


async def events(request: web.Request) -> web.StreamResponse:
    handle = _handle(request)
    raw = request.headers.get("Last-Event-ID", request.query.get("since", "0"))
    try:
        since = int(raw)  # the last event the client has: resume after it
    except ValueError:
        raise HttpError(400, "invalid_request", f"Last-Event-ID / since must be an integer, got {raw!r}") from None
    if since < 0:
        raise HttpError(400, "invalid_request", f"Last-Event-ID / since must be >= 0, got {since}")
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    async for ev in handle.events(since=since):
        await resp.write(f"id: {ev['seq']}\nevent: {ev['kind']}\ndata: {json.dumps(ev)}\n\n".encode())
    await resp.write_eof()
    return resp


async def health(request: web.Request) -> web.Response:
    running = request.app[ROLLOUTS_KEY].running
    return web.json_response({"status": "ok" if running else "stopped"}, status=200 if running else 503)


def make_app(rollouts: Rollouts, token: str) -> web.Application:
    if not token:
        raise ConfigError("farm serve needs a non-empty bearer token")
    app = web.Application(middlewares=[_auth_middleware(token)], client_max_size=BODY_LIMIT)
    app[ROLLOUTS_KEY] = rollouts
    app.add_routes([
        web.post("/rollouts", create),
        web.get("/rollouts", listing),
        web.get("/rollouts/{id}", state),
        web.get("/rollouts/{id}/events", events),
        web.get("/rollouts/{id}/messages", messages),
        web.post("/rollouts/{id}/abort", abort),
        web.post("/rollouts/{id}/finalize", finalize),
        web.get("/health", health),
    ])  # fmt: skip
    return app
