"""The aiohttp app: routes, auth, body checks, streaming, errors in each protocol's shape.

Routes: ``POST /v1/messages`` (also ``?beta=true``), ``POST /v1/messages/count_tokens``,
``POST /v1/responses``, ``POST /v1/chat/completions`` (each also without ``/v1``),
``GET /v1/models``, ``HEAD /``, ``GET /``, ``GET /health``.

Statuses: 401 missing/unknown/closed key; 400 malformed JSON or a request the protocol
rejects or that breaks a bound (:mod:`farm.gateway.bounds`: too many messages, too
deep, a prompt too long to fit, a tool history that contradicts itself); 413 body over
``GatewayConfig.body_limit`` (before it is read); 415 a non-JSON content type; 404/405 unknown
routes; engine failures: 504 (timeout), 529 Anthropic / 503 OpenAI shapes (engine
unavailable after retries), 400 (engine rejected the prompt); anything unexpected is
a 500 in the protocol's error shape (and logged), never an unhandled exception.

Streaming: the turn runs as its own task. If it finishes (or fails) within
``first_byte_deadline_s`` the client gets the whole event sequence at once (or a
plain error with its exact status). Otherwise the stream is committed (status 200 and
the protocol's opening events), SSE keepalive comments follow every ``keepalive_s``,
and a failure arrives as the protocol's in-stream error event. A client that goes
away cancels the turn, which aborts the generation at the engine.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from farm.errors import GatewayRequestError
from farm.gateway.anthropic import AnthropicProtocol
from farm.gateway.blackbox import BlackBoxService
from farm.gateway.bounds import check_body
from farm.gateway.canonical import TurnOutput
from farm.gateway.chat import ChatProtocol
from farm.gateway.config import GatewayConfig
from farm.gateway.responses import ResponsesProtocol
from farm.gateway.service import TurnService
from farm.gateway.sessions import Session, SessionTable
from farm.gateway.wire import KEEPALIVE, ReplyContext, WireProtocol

log = logging.getLogger(__name__)
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class GatewayApp:
    """Builds the ``web.Application``; state lives in the session table and the service."""

    def __init__(self, config: GatewayConfig, sessions: SessionTable, service: TurnService | BlackBoxService,
                 model_name: str) -> None:
        self.socket_sessions: dict[str, str] = {}  # unix socket path -> the one session it serves
        self.config = config
        self.sessions = sessions
        self.service = service
        self.model_name = model_name
        self.anthropic = AnthropicProtocol()
        self.responses = ResponsesProtocol()
        self.chat = ChatProtocol()

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.config.body_limit, middlewares=[self._guard])
        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/messages", self._messages)
            app.router.add_post(f"{prefix}/messages/count_tokens", self._count_tokens)
            app.router.add_post(f"{prefix}/responses", self._responses)
            app.router.add_post(f"{prefix}/chat/completions", self._chat)
            app.router.add_get(f"{prefix}/models", self._models)
        app.router.add_route("HEAD", "/", self._root)
        app.router.add_get("/", self._root, allow_head=False)
        app.router.add_get("/health", self._health)
        return app

    # ---- plumbing ----------------------------------------------------------------
    def _protocol_for(self, path: str) -> WireProtocol:
        if "/messages" in path:
            return self.anthropic
        return self.chat if "/chat/" in path else self.responses

    def _error(self, proto: WireProtocol, err: GatewayRequestError) -> web.Response:
        status, body = proto.error_body(err)
        return _json(status, body)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        proto = self._protocol_for(request.path)
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = {404: "not_found", 405: "invalid_request", 413: "too_large"}.get(exc.status, "invalid_request")
            message = f"{request.method} {request.path}: {exc.reason}"
            return self._error(proto, GatewayRequestError(message, status=exc.status, kind=kind))
        except GatewayRequestError as err:
            return self._error(proto, err)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # a bug: answer in the protocol's shape, keep serving
            log.exception("gateway: unhandled error on %s %s", request.method, request.path)
            return self._error(proto, GatewayRequestError(f"internal gateway error: {exc!r}", status=500,
                                                          kind="api_error"))  # fmt: skip

    def _authenticate(self, request: web.Request) -> Session:
        creds = []
        key = request.headers.get("x-api-key")
        if key:
            creds.append(key.strip())
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            creds.append(auth[7:].strip())
        session = self.sessions.authenticate(creds)
        # A request through a session's own unix socket (a sandbox's forwarded port) is
        # served only with THAT session's key: a sandbox never reaches another session.
        sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
        if isinstance(sockname, str) and sockname:
            owner = self.socket_sessions.get(sockname)
            if owner != session.session_id:
                if owner is not None and owner in self.sessions.open_ids():
                    stats = self.sessions.get(owner).stats
                    stats.foreign_key_refusals += 1
                    if stats.foreign_key_refusals == 1:
                        log.warning("gateway: session %s's socket was sent another session's key", owner)
                raise GatewayRequestError("invalid API key", status=401, kind="authentication")
        return session

    async def _read_json(self, request: web.Request) -> Any:
        ctype = request.content_type
        if ctype != "application/json" and not ctype.endswith("+json"):
            raise GatewayRequestError(f"Content-Type must be application/json, got {ctype!r}", status=415,
                                      kind="unsupported_media")  # fmt: skip
        limit = self.config.body_limit
        if request.content_length is not None and request.content_length > limit:
            raise GatewayRequestError(f"request body of {request.content_length} bytes is over {limit} "
                                      f"(gateway.max_body_bytes)", status=413, kind="too_large")  # fmt: skip
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as exc:
            raise GatewayRequestError(f"request body over {limit} bytes", status=413, kind="too_large") from exc
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise GatewayRequestError(f"malformed JSON body: {exc}", status=400) from exc

    # ---- generation ----------------------------------------------------------------
    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self.anthropic)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self.responses)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, self.chat)

    async def _generate(self, request: web.Request, proto: WireProtocol) -> web.StreamResponse:
        session = self._authenticate(request)
        body = await self._read_json(request)
        check_body(body, self.config)
        req = proto.parse(body, request.headers, session.memo(proto.name))
        if not req.model:
            req.model = session.model_name
        pending = await self.service.begin(session, req, call_id_prefix=proto.call_id_prefix)
        ctx = proto.new_context(req, pending.prompt_tokens)
        task = asyncio.ensure_future(self.service.run(pending))
        session.track(task)
        try:
            if not req.stream:
                out = await self._result(task, None)
                assert out is not None
                return _json(200, proto.reply(req, ctx, out))
            return await self._stream(request, proto, req, ctx, task)
        finally:
            if not task.done():
                task.cancel()

    async def _result(self, task: asyncio.Task[TurnOutput], timeout: float | None) -> TurnOutput | None:
        """The turn's output, None if still running after ``timeout``; errors as GatewayRequestError."""
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            return None
        if task.cancelled():
            raise GatewayRequestError("the session was closed while generating", status=401, kind="authentication")
        exc = task.exception()
        if isinstance(exc, GatewayRequestError):
            raise exc
        if exc is not None:
            log.error("gateway: turn failed", exc_info=exc)
            raise GatewayRequestError(f"internal gateway error: {exc!r}", status=500, kind="api_error")
        return task.result()

    async def _stream(self, request: web.Request, proto: WireProtocol, req: Any, ctx: ReplyContext,
                      task: asyncio.Task[TurnOutput]) -> web.StreamResponse:
        out = await self._result(task, self.config.first_byte_deadline_s)  # errors here keep their status
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        try:
            await self._stream_body(resp, proto, req, ctx, task, out)
        except ConnectionResetError:
            # the client left mid-reply (a CLI killed as its rollout ended) before aiohttp saw the
            # connection lost and cancelled this handler: nobody to answer, not the gateway's error
            log.info("gateway: the client closed the connection during the reply")
        return resp

    async def _stream_body(self, resp: web.StreamResponse, proto: WireProtocol, req: Any, ctx: ReplyContext,
                           task: asyncio.Task[TurnOutput], out: TurnOutput | None) -> None:
        if out is not None:
            await resp.write(proto.stream_head(req, ctx) + proto.stream_rest(req, ctx, out))
            await resp.write_eof()
            return
        await resp.write(proto.stream_head(req, ctx))
        tail: bytes
        try:
            while out is None:
                out = await self._result(task, self.config.keepalive_s)
                if out is None:
                    await resp.write(KEEPALIVE)
            tail = proto.stream_rest(req, ctx, out)
        except GatewayRequestError as err:
            tail = proto.stream_error(ctx, err)
        await resp.write(tail)
        await resp.write_eof()

    # ---- other routes ----------------------------------------------------------------
    async def _count_tokens(self, request: web.Request) -> web.Response:
        session = self._authenticate(request)
        body = await self._read_json(request)
        if isinstance(body, dict) and "max_tokens" not in body:
            body = {**body, "max_tokens": 1}
        req = self.anthropic.parse(body, request.headers)
        return _json(200, {"input_tokens": await self.service.count_tokens(session, req)})

    async def _models(self, request: web.Request) -> web.Response:
        entry = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "farm",
                 "type": "model", "display_name": self.model_name, "created_at": "1970-01-01T00:00:00Z"}  # fmt: skip
        return _json(200, {"object": "list", "data": [entry], "has_more": False,
                           "first_id": self.model_name, "last_id": self.model_name})  # fmt: skip

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(status=200, text="" if request.method == "HEAD" else "farm gateway\n")

    async def _health(self, request: web.Request) -> web.Response:
        return _json(200, {"status": "ok", "sessions": len(self.sessions)})
