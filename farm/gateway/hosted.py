"""HTTP client of one hosted endpoint: one call per turn, retries, errors classified.

:func:`classify` turns an HTTP status + error body into one :class:`Failure` kind;
:func:`retry_delay` (pure) decides whether and how long to wait before retrying:
429 honours ``retry-after`` (seconds or an HTTP date), 5xx / 529 / timeouts /
connection errors back off exponentially from ``backoff_s``; all within
``max_retries`` and the budget: ``retry_budget_s``, or less when the caller's deadline
(the agent phase's end) is nearer (a retry-after beyond the budget fails the turn at
once rather than sleeping past it: an endpoint failure, not the policy's timeout). 401/403 (``auth``), context-length refusals
(``context_length``) and other 4xx (``rejected``) are never retried.
"""

from __future__ import annotations

import asyncio
import email.utils
import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import aiohttp
import orjson

from farm.errors import GatewayError
from farm.gateway.endpoints import AnthropicEndpoint, HostedEndpoint
from farm.gateway.canonical import CanonicalRequest
from farm.gateway.hosted_wire import HostedReply, build, parse

# How the vendors (and vLLM / SGLang / farm's own gateway) word a prompt over the context window.
CONTEXT_MARKERS = (
    "context_length_exceeded", "maximum context length", "context window", "prompt is too long",
    "too many tokens", "input is too long", "exceeds the context",
)  # fmt: skip


class Failure(str, Enum):
    AUTH = "auth"  # 401 / 403: the key is wrong or lacks access (configuration)
    RATE_LIMIT = "rate_limit"  # 429
    SERVER = "server"  # 5xx, 529, 408
    TIMEOUT = "timeout"  # no reply within timeout_s, or the connection broke
    CONTEXT_LENGTH = "context_length"  # the prompt does not fit the model's window
    REJECTED = "rejected"  # any other 4xx, or a reply farm cannot read

    @property
    def retried(self) -> bool:
        return self in (Failure.RATE_LIMIT, Failure.SERVER, Failure.TIMEOUT)


class EndpointError(GatewayError):
    """A hosted endpoint call that failed for good (after any retries)."""

    def __init__(self, failure: Failure, message: str, *, status: int | None = None, attempts: int = 1) -> None:
        super().__init__(message)
        self.failure, self.status, self.attempts = failure, status, attempts


def classify(status: int, text: str) -> Failure:
    if status in (401, 403):
        return Failure.AUTH
    if status == 429:
        return Failure.RATE_LIMIT
    if status in (400, 413, 422) and any(m in text.lower() for m in CONTEXT_MARKERS):
        return Failure.CONTEXT_LENGTH
    if status >= 500 or status == 408:
        return Failure.SERVER
    return Failure.REJECTED


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``retry-after`` header (delta-seconds or an HTTP date); None if absent/unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


def retry_delay(failure: Failure, attempt: int, retry_after: float | None, waited_s: float,
                ep: HostedEndpoint, left_s: float | None = None) -> float | None:
    """Seconds to wait before retry number ``attempt`` (1-based), or None: give up.
    ``left_s``: time left before the caller's deadline (None: no deadline)."""
    if not failure.retried or attempt > ep.max_retries:
        return None
    delay = retry_after if retry_after is not None else ep.backoff_s * (2 ** (attempt - 1))
    if waited_s + delay > ep.retry_budget_s or (left_s is not None and delay >= left_s):
        return None
    return delay


def _error_text(raw: bytes) -> str:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:500].decode(errors="replace")
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return f"{err.get('type') or err.get('code') or ''}: {err.get('message') or ''}".strip(": ")
    return str(body)[:500]


@dataclass(frozen=True, slots=True)
class HostedCall:
    reply: HostedReply
    latency_ms: float
    attempts: int


class HostedClient:
    """Calls one endpoint with its key (never logged, never recorded)."""

    def __init__(self, name: str, endpoint: HostedEndpoint, api_key: str | None) -> None:
        self.name = name
        self.endpoint = endpoint
        self._api_key = api_key
        self._http: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        ep = self.endpoint
        headers = {"Content-Type": "application/json", **ep.headers}
        if isinstance(ep, AnthropicEndpoint):
            headers["anthropic-version"] = ep.anthropic_version
            if self._api_key:
                headers["x-api-key"] = self._api_key
        elif self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def close(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.close()

    async def complete(self, req: CanonicalRequest, *, deadline: float | None = None) -> HostedCall:
        """One turn: the reply, or EndpointError once retries (if any) are spent.
        ``deadline`` (``time.monotonic()``): no retry waits past it."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.endpoint.timeout_s))
        route, body = build(req, self.endpoint)
        url, payload = self.endpoint.base_url + route, orjson.dumps(body)
        t0 = time.monotonic()
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            failure, status, message, retry_after = await self._once(url, payload)
            if failure is None:
                assert isinstance(message, HostedReply)
                return HostedCall(message, (time.monotonic() - t0) * 1e3, attempt)
            left = deadline - time.monotonic() if deadline is not None else None
            delay = retry_delay(failure, attempt, retry_after, waited, self.endpoint, left)
            if delay is None:
                spent = f" after {attempt} attempts" if attempt > 1 else ""
                text = f"endpoint {self.name!r} ({url}): {message}{spent}"
                if self._api_key:  # some vendors echo the key they refused
                    text = text.replace(self._api_key, "<redacted:api-key>")
                raise EndpointError(failure, text, status=status, attempts=attempt)
            await asyncio.sleep(delay)
            waited += delay

    async def _once(self, url: str, payload: bytes) -> tuple[Failure | None, int | None, Any, float | None]:
        assert self._http is not None
        try:
            async with self._http.post(url, data=payload, headers=self._headers()) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    text = _error_text(raw)
                    return (classify(resp.status, text), resp.status, f"HTTP {resp.status} {text}",
                            parse_retry_after(resp.headers.get("retry-after")))  # fmt: skip
        except asyncio.TimeoutError:
            return Failure.TIMEOUT, None, f"no reply within {self.endpoint.timeout_s:g} s", None
        except aiohttp.ClientError as exc:
            return Failure.TIMEOUT, None, f"connection failed: {exc!r}", None
        try:
            return None, resp.status, parse(orjson.loads(raw), self.endpoint), None
        except (orjson.JSONDecodeError, ValueError, TypeError, AttributeError, KeyError) as exc:
            return Failure.REJECTED, resp.status, f"unreadable reply: {exc!r}", None
