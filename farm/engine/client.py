"""The SGLang ``/generate`` client the gateway calls (token ids in, ids + logprobs out).

One pooled ``aiohttp`` session per client. Every call carries the session id as
``X-SMG-Routing-Key`` (sticky routing in ``sglang-router --policy manual``) and a
``rid``. Retries with jittered exponential backoff happen only for failures that are
safe to retry: connection errors, HTTP 5xx and a reply that is cut off mid-body
(``EngineRetryableError``); a 4xx is final (``EngineRejected``), a call that exceeds
``request_timeout_s`` is final (``EngineTimeout``).

Abort: cancelling the task that awaits :meth:`EngineClient.generate` closes its HTTP
connection (SGLang and the router drop the request when the client goes away); with
``abort_request`` on, the client also posts ``/abort_request {rid}`` (honoured by
workers, a harmless 404 from the router).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import aiohttp
import numpy as np
import orjson
import xxhash

from farm.errors import EngineError, EngineRejected, EngineRetryableError, EngineTimeout
from farm.engine.config import EngineClientConfig
from farm.engine.routing import decode_routed

ROUTING_HEADER = "X-SMG-Routing-Key"
# Replies larger than this (routed experts of long contexts: 1.5 KB per position at
# 48 layers x top-8) are parsed in a thread so one session's payload does not stall the
# gateway's event loop for every other session.
OFF_LOOP_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One ``/generate`` call. ``sampling_params`` are SGLang's (sent as given)."""

    input_ids: Sequence[int] | np.ndarray  # a contiguous int array is serialized without a copy
    sampling_params: dict[str, Any]
    rid: str
    routing_key: str | None = None
    return_logprob: bool = True
    # MoE routing replay: ask for the experts of positions [routed_experts_start_len, seqlen - 1)
    routed_experts_start_len: int | None = None

    def body(self) -> dict[str, Any]:
        body = {
            "input_ids": self.input_ids if isinstance(self.input_ids, np.ndarray) else list(self.input_ids),
            "sampling_params": self.sampling_params,
            "return_logprob": self.return_logprob,
            "logprob_start_len": -1,
            "rid": self.rid,
            "stream": False,
        }
        if self.routed_experts_start_len is not None:
            body["return_routed_experts"] = True
            body["routed_experts_start_len"] = self.routed_experts_start_len
        return body


@dataclass(frozen=True, slots=True)
class GenerateResult:
    """What the model produced: ``output_ids`` verbatim, one logprob per id (or none)."""

    output_ids: list[int]
    output_logprobs: list[float]
    finish_type: str  # stop | length | abort
    matched: int | str | None = None  # the stop token id / stop string (finish_type == stop)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    weight_version: str | None = None
    attempts: int = 1
    engine_ms: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)
    routed_experts: np.ndarray | None = None  # [positions, layers, top_k], compact dtype
    routed_start: int = 0  # absolute position of its first row
    routed_bytes: int = 0  # size of the payload as it came over the wire


def parse_generate_reply(data: Any) -> GenerateResult:
    """SGLang's ``/generate`` reply -> :class:`GenerateResult` (raises ``EngineError`` if malformed)."""
    if isinstance(data, list):  # batched form with one prompt
        data = data[0] if len(data) == 1 else None
    if not isinstance(data, dict):
        raise EngineError("engine reply is not a JSON object")
    meta = data.get("meta_info") or {}
    ids = data.get("output_ids")
    token_lps = meta.get("output_token_logprobs")
    if ids is None and isinstance(token_lps, list):
        ids = [int(t[1]) for t in token_lps]
    if not isinstance(ids, list):
        raise EngineError("engine reply has no output_ids")
    lps: list[float] = []
    if isinstance(token_lps, list) and token_lps:
        if len(token_lps) != len(ids):
            raise EngineError(f"engine reply: {len(token_lps)} logprobs for {len(ids)} output ids")
        lps = [float(t[0]) if t[0] is not None else 0.0 for t in token_lps]
    finish = meta.get("finish_reason") or {}
    if isinstance(finish, str):
        finish = {"type": finish}
    ftype = str(finish.get("type") or "stop")
    if ftype not in ("stop", "length", "abort"):
        ftype = "abort"
    return GenerateResult(
        output_ids=[int(i) for i in ids],
        output_logprobs=lps,
        finish_type=ftype,
        matched=finish.get("matched"),
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        weight_version=None if meta.get("weight_version") is None else str(meta.get("weight_version")),
        meta={k: finish[k] for k in ("message", "length") if k in finish},
    )


def backoff_delay(attempt: int, cfg: EngineClientConfig, rng: random.Random) -> float:
    """Delay before retry ``attempt`` (1-based): exponential, capped, full jitter above half."""
    base = min(cfg.backoff_max_s, cfg.backoff_s * (2 ** (attempt - 1)))
    return base * (0.5 + 0.5 * rng.random())


class EngineClient:
    """Async client for one SGLang endpoint (a worker or the router).

    Use as ``async with EngineClient(url, cfg) as engine:`` or call :meth:`close`.
    The HTTP session is created lazily inside the running loop.
    """

    def __init__(self, base_url: str, config: EngineClientConfig | None = None, *, seed: int | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.config = config or EngineClientConfig()
        self._session: aiohttp.ClientSession | None = None
        self._rng = random.Random(seed)
        self._closed = False
        self._workers: list[str] | None = None  # the router's workers (routed experts go to them directly)

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._closed:
            raise EngineError("engine client is closed")
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.config.pool_size, limit_per_host=self.config.pool_size)
            self._session = aiohttp.ClientSession(
                connector=connector,
                json_serialize=lambda o: orjson.dumps(o).decode(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s),
            )
        return self._session

    async def close(self) -> None:
        """Idempotent."""
        self._closed = True
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    # ---- generate --------------------------------------------------------------
    async def generate(self, req: GenerateRequest) -> GenerateResult:
        """Generate with retries (connection errors, 5xx, cut-off replies only).

        Raises ``EngineRejected`` (4xx), ``EngineTimeout`` (request_timeout_s passed),
        ``EngineRetryableError`` (retries exhausted). Cancellation aborts the request.
        """
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.config.request_timeout_s
        attempt = 0
        while True:
            attempt += 1
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EngineTimeout(f"/generate {req.rid}: no reply within {self.config.request_timeout_s:g}s")
                result = await self._once(req, remaining)
            except EngineRetryableError:
                if attempt > self.config.retries:
                    raise
                delay = backoff_delay(attempt, self.config, self._rng)
                if time.monotonic() + delay >= deadline:
                    raise
                await asyncio.sleep(delay)
                continue
            except asyncio.CancelledError:
                await self._abort_quietly(req)
                raise
            except EngineTimeout:
                await self._abort_quietly(req)
                raise
            return dataclasses.replace(result, attempts=attempt, engine_ms=(time.perf_counter() - t0) * 1e3)

    async def _target(self, req: GenerateRequest) -> str:
        """Where ``req`` goes: the base URL, or, for a routed-experts request behind a router
        (``routed_experts_direct``), the worker its routing key maps to (rendezvous hashing
        over the router's ``GET /workers``: a session stays on one worker, and only the
        sessions of a worker that leaves move)."""
        if req.routed_experts_start_len is None or not self.config.routed_experts_direct:
            return self.base_url
        if self._workers is None:
            self._workers = await self._list_workers()
        if not self._workers:
            return self.base_url  # a plain SGLang server, not a router
        key = (req.routing_key or req.rid).encode()
        return max(self._workers, key=lambda u: xxhash.xxh3_64_intdigest(key + b"\x00" + u.encode()))

    async def _list_workers(self) -> list[str]:
        try:
            async with self._http().get(f"{self.base_url}/workers", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    return []
                body = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise EngineRetryableError(f"GET {self.base_url}/workers: {exc!r}") from exc
        workers = body.get("workers") if isinstance(body, dict) else None
        if not isinstance(workers, list):
            return []
        healthy = [str(w["url"]).rstrip("/") for w in workers if isinstance(w, dict) and w.get("url")
                   and w.get("is_healthy", True)]
        return sorted(healthy)

    async def _once(self, req: GenerateRequest, timeout_s: float) -> GenerateResult:
        headers = {"Content-Type": "application/json"}
        if req.routing_key:
            headers[ROUTING_HEADER] = req.routing_key
        base = await self._target(req)
        if base != self.base_url:
            try:
                return await self._post(req, timeout_s, base, headers)
            except EngineRetryableError:
                self._workers = None  # the worker may have left: ask the router again before the retry
                raise
        return await self._post(req, timeout_s, base, headers)

    async def _post(self, req: GenerateRequest, timeout_s: float, base: str, headers: dict[str, str]) -> GenerateResult:
        url = f"{base}/generate"
        try:
            async with asyncio.timeout(timeout_s):
                async with self._http().post(url, data=orjson.dumps(req.body(), option=orjson.OPT_SERIALIZE_NUMPY), headers=headers) as resp:
                    raw = await resp.read()
                    status = resp.status
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
            raise EngineRetryableError(f"/generate {req.rid}: reply cut off: {exc!r}") from exc
        except aiohttp.ClientError as exc:  # incl. connect timeouts (also TimeoutError subclasses)
            raise EngineRetryableError(f"/generate {req.rid}: {exc!r}") from exc
        except TimeoutError as exc:
            raise EngineTimeout(f"/generate {req.rid}: no reply within {timeout_s:.3g}s") from exc
        except OSError as exc:
            raise EngineRetryableError(f"/generate {req.rid}: {exc!r}") from exc
        if status >= 500:
            raise EngineRetryableError(f"/generate {req.rid}: HTTP {status}: {_message(raw)}")
        if status >= 400:
            raise EngineRejected(f"/generate {req.rid}: HTTP {status}: {_message(raw)}", status=status)
        if len(raw) > OFF_LOOP_BYTES:  # a long routed-experts payload: decoded off the event loop
            return await asyncio.to_thread(self._parse, req, raw)
        return self._parse(req, raw)

    def _parse(self, req: GenerateRequest, raw: bytes) -> GenerateResult:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise EngineRetryableError(f"/generate {req.rid}: reply is not JSON (cut off?)") from exc
        try:
            result = parse_generate_reply(data)
        except EngineError as exc:  # a 200 that is not a /generate reply: the engine's fault, retried
            raise EngineRetryableError(f"/generate {req.rid}: malformed reply: {exc}") from exc
        if req.routed_experts_start_len is not None and self.config.routed_experts is not None:
            result = self._with_routing(req, result, data)
        return result

    def _with_routing(self, req: GenerateRequest, result: GenerateResult, data: Any) -> GenerateResult:
        """Decode and check the reply's routed experts. A missing or misshapen payload is
        a final engine error (a configuration mismatch does not heal on retry)."""
        meta = (data[0] if isinstance(data, list) else data).get("meta_info") or {}
        payload = meta.get("routed_experts")
        start = req.routed_experts_start_len or 0
        if not isinstance(payload, str):
            raise EngineError(f"/generate {req.rid}: asked for routed experts and got none (is the server "
                              "started with --enable-return-routed-experts?)")
        rows = len(req.input_ids) + len(result.output_ids) - 1 - start
        try:
            experts = decode_routed(payload, max(0, rows), self.config.routed_experts)
        except EngineError as exc:
            raise EngineError(f"/generate {req.rid}: {exc}") from None
        return dataclasses.replace(result, routed_experts=experts, routed_start=start, routed_bytes=len(payload))

    async def abort(self, rid: str) -> bool:
        """POST ``/abort_request {rid}``; True if the engine accepted it."""
        if not self.config.abort_request or self._closed:
            return False
        try:
            async with asyncio.timeout(self.config.abort_timeout_s):
                async with self._http().post(
                    f"{self.base_url}/abort_request",
                    data=orjson.dumps({"rid": rid}),
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    await resp.read()
                    return resp.status < 400
        except (TimeoutError, aiohttp.ClientError, OSError, EngineError):
            return False

    async def _abort_quietly(self, req: GenerateRequest) -> None:
        """Best effort, shielded so a cancelled caller still sends it."""
        if not self.config.abort_request or self._closed:
            return
        task = asyncio.ensure_future(self.abort(req.rid))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass

    async def health(self) -> bool:
        try:
            async with asyncio.timeout(self.config.connect_timeout_s):
                async with self._http().get(f"{self.base_url}/health") as resp:
                    await resp.read()
                    return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False


def _message(raw: bytes) -> str:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if "message" in data:
            return str(data["message"])[:300]
    return str(data)[:300]
