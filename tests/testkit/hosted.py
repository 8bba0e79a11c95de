"""A protocol-faithful stand-in for a hosted LLM API (OpenAI chat / responses, Anthropic
messages), for tests and demos of black-box mode.

No vendor endpoint is reachable here, so this serves the vendors' wire protocols the
way farm already does for the CLIs: a real aiohttp server in front of farm's own
gateway (those protocols, streamed or not) + a scripted worker running the ``oracle``
policy on the given tasks. It checks an API key the way the vendors do (``x-api-key``
or ``Authorization: Bearer``; 401 otherwise) and can inject the failures hosted APIs
have: a status (401, 403, 429 with ``retry-after``, 500, 529), a hang (timeout), or a
context-length refusal worded as each vendor words it. A non-streamed chat request
with ``logprobs: true`` gets OpenAI-shaped ``choices[0].logprobs.content`` for its
reply text (one entry per token of the fake's tokenizer; the values are made up).
Every generation request it served is kept in ``requests`` (path, body, headers).

::

    async with HostedFake(tasks, tokenizer, api_key="sk-test") as fake:
        fake.inject(Fault(status=429, retry_after=1.0))
        ...  # an endpoint with base_url=fake.base_url + "/v1"

``run_in_thread`` serves it from a thread of its own (for a blocking ``run_batch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import aiohttp
import orjson
from aiohttp import web

from farm.engine.client import EngineClient
from farm.simulator import ScriptedWorker, WorkerSettings, serve_worker
from farm.simulator.oracle import OraclePolicy
from farm.gateway.config import GatewayConfig
from farm.gateway.gateway import Gateway
from farm.tasks.model import Task

GENERATION_ROUTES = ("/messages", "/chat/completions", "/responses")


@dataclass(frozen=True)
class Fault:
    """One injected failure, applied to the next ``times`` generation requests."""

    status: int | None = None  # an HTTP error status
    retry_after: float | None = None  # with 429: the retry-after header (seconds)
    hang_s: float | None = None  # no reply for this long (the client's timeout fires first)
    context_length: bool = False  # a 400 "prompt too long", worded per protocol
    times: int = 1


def _error(path: str, status: int, kind: str, message: str) -> web.Response:
    if "/messages" in path:
        body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {"error": {"message": message, "type": kind, "param": None, "code": kind}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class HostedFake:
    def __init__(self, tasks: Iterable[Task], tokenizer: Any, *, api_key: str = "sk-test-hosted",
                 model_name: str = "hosted-model", host: str = "127.0.0.1") -> None:
        self.api_key = api_key
        self.host = host
        self.requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self._faults: deque[list[Any]] = deque()
        self._worker = ScriptedWorker(tokenizer, OraclePolicy(list(tasks)), WorkerSettings(model_name=model_name))
        self._tokenizer = tokenizer
        self._model_name = model_name
        self._stack = contextlib.AsyncExitStack()
        self._secret = ""
        self._inner = ""
        self._http: aiohttp.ClientSession | None = None
        self.base_url = ""

    def inject(self, fault: Fault) -> None:
        self._faults.append([fault, fault.times])

    async def __aenter__(self) -> HostedFake:
        stack = self._stack
        worker_url = await stack.enter_async_context(serve_worker(self._worker))
        engine = await stack.enter_async_context(EngineClient(worker_url))
        # a vendor answers a spent output budget with its length stop (max_tokens / length / incomplete)
        cfg = GatewayConfig(fidelity="off", max_turns=1_000_000, first_byte_deadline_s=60.0, budget_ends_session=False)
        gateway = await stack.enter_async_context(Gateway(cfg, self._tokenizer, engine, model_name=self._model_name))
        self._secret = gateway.open_session("hosted", max_turns=1_000_000).secret
        self._inner = gateway.base_url
        self._http = aiohttp.ClientSession()
        stack.push_async_callback(self._http.close)
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.base_url = f"http://{self.host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    def _take_fault(self) -> Fault | None:
        if not self._faults:
            return None
        entry = self._faults[0]
        entry[1] -= 1
        if entry[1] <= 0:
            self._faults.popleft()
        return entry[0]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        key = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
        if key.strip() != self.api_key:
            return _error(path, 401, "authentication_error", "invalid x-api-key")
        body = await request.read()
        if request.method == "POST" and path.endswith(GENERATION_ROUTES):
            self.requests.append((path, orjson.loads(body) if body else {}, dict(request.headers)))
            fault = self._take_fault()
            if fault is not None:
                if fault.hang_s is not None:
                    await asyncio.sleep(fault.hang_s)  # the fault: a reply that hangs
                if fault.context_length:
                    msg = ("prompt is too long: 210000 tokens > 200000 maximum" if "/messages" in path else
                           "This model's maximum context length is 131072 tokens (context_length_exceeded)")
                    return _error(path, 400, "invalid_request_error", msg)
                if fault.status is not None:
                    resp = _error(path, fault.status, "rate_limit_error" if fault.status == 429 else "api_error",
                                  f"injected HTTP {fault.status}")  # fmt: skip
                    if fault.retry_after is not None:
                        resp.headers["retry-after"] = f"{fault.retry_after:g}"
                    return resp
            parsed = orjson.loads(body) if body else {}
            if path.endswith("/chat/completions") and parsed.get("logprobs") and not parsed.get("stream"):
                return await self._with_logprobs(request, body)
        return await self._forward(request, body)

    async def _with_logprobs(self, request: web.Request, body: bytes) -> web.Response:
        assert self._http is not None
        async with self._http.post(self._inner + request.path_qs, data=body, headers=self._inner_headers()) as up:
            status, reply = up.status, await up.json()
        if status == 200:
            choice = reply["choices"][0]
            ids = self._tokenizer.encode(choice["message"].get("content") or "", add_special_tokens=False)
            choice["logprobs"] = {"content": [
                {"token": self._tokenizer.decode([i]), "logprob": -0.01 - 0.125 * (n % 7), "top_logprobs": []}
                for n, i in enumerate(ids)]}  # fmt: skip
        return web.Response(status=status, body=orjson.dumps(reply), content_type="application/json")

    def _inner_headers(self) -> dict[str, str]:
        return {"Content-Type": "application/json", "x-api-key": self._secret, "Authorization": f"Bearer {self._secret}"}

    async def _forward(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """Pass the request to farm's gateway (with its session key) and relay the reply as it comes."""
        assert self._http is not None
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json"),
                   "x-api-key": self._secret, "Authorization": f"Bearer {self._secret}"}  # fmt: skip
        async with self._http.request(request.method, self._inner + request.path_qs, data=body or None,
                                      headers=headers) as upstream:  # fmt: skip
            resp = web.StreamResponse(status=upstream.status,
                                      headers={"Content-Type": upstream.headers.get("Content-Type", "")})
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


@contextlib.contextmanager
def run_in_thread(fake: HostedFake) -> Iterator[HostedFake]:
    """Serve ``fake`` from its own event loop in a daemon thread (for blocking callers)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="hosted-fake", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(fake.__aenter__(), loop).result(timeout=60)
        try:
            yield fake
        finally:
            asyncio.run_coroutine_threadsafe(fake.__aexit__(None, None, None), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

