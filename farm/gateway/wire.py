"""What every wire protocol module provides, plus small shared helpers (SSE, ids, errors).

A protocol module (``anthropic``, ``responses``, ``chat``) translates its native
request into a :class:`CanonicalRequest` and writes a finished :class:`TurnOutput`
back, non-streamed or as the exact SSE event sequence its CLI consumes. The app is
generic over them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

import orjson

from farm.errors import GatewayRequestError
from farm.gateway.canonical import CanonicalRequest, TranslationMemo, TurnOutput

KEEPALIVE = b": keepalive\n\n"


@dataclass(frozen=True, slots=True)
class ReplyContext:
    """Ids and names a reply carries (fixed when the turn starts)."""

    response_id: str
    model: str
    prompt_tokens: int = 0
    created: int = field(default_factory=lambda: int(time.time()))


class WireProtocol(Protocol):
    name: str
    call_id_prefix: str

    def parse(self, body: Any, headers: Mapping[str, str], memo: TranslationMemo | None = None) -> CanonicalRequest:
        """Native request -> canonical; raises ``GatewayRequestError`` (400) on bad input.
        ``memo`` reuses the translations of messages equal to the previous request's."""
        ...

    def new_context(self, req: CanonicalRequest, prompt_tokens: int) -> ReplyContext: ...

    def reply(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> dict[str, Any]:
        """The non-streamed reply body."""
        ...

    def stream_head(self, req: CanonicalRequest, ctx: ReplyContext) -> bytes:
        """Events sent as soon as the stream is committed."""
        ...

    def stream_rest(self, req: CanonicalRequest, ctx: ReplyContext, out: TurnOutput) -> bytes:
        """Every event after the head, up to the protocol's end marker."""
        ...

    def stream_error(self, ctx: ReplyContext, err: GatewayRequestError) -> bytes:
        """An error after the stream was committed (status 200 already sent)."""
        ...

    def error_body(self, err: GatewayRequestError) -> tuple[int, dict[str, Any]]:
        """(HTTP status, error JSON) in the protocol's own shape."""
        ...


def new_id(prefix: str, n: int = 24) -> str:
    return prefix + uuid.uuid4().hex[:n]


def dumps(obj: Any) -> bytes:
    return orjson.dumps(obj)


def sse(data: Any, event: str | None = None) -> bytes:
    """One SSE event; ``data`` is JSON-encoded unless it is already bytes."""
    payload = data if isinstance(data, bytes) else orjson.dumps(data)
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


def bad_request(message: str) -> GatewayRequestError:
    return GatewayRequestError(message, status=400, kind="invalid_request")


def stop_list(val: str | list[str] | None) -> list[str]:
    """A validated ``stop`` value as the list of its non-empty strings."""
    if val is None:
        return []
    if isinstance(val, str):
        return [val] if val else []
    return [s for s in val if s]


def text_of(content: Any, *, what: str) -> str:
    """Text of a content value: a string, or a list of text-ish parts (others -> placeholder)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{what}: content must be a string or a list of parts")
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
            continue
        if not isinstance(part, dict):
            raise bad_request(f"{what}: content parts must be objects")
        kind = part.get("type")
        if isinstance(part.get("text"), str) and kind in (None, "text", "input_text", "output_text", "refusal",
                                                          "summary_text", "reasoning_text"):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        elif kind in ("image", "input_image", "image_url"):
            parts.append("[image]")
        elif kind in ("document", "input_file", "file"):
            parts.append("[file]")
        elif kind == "tool_reference" or kind is None:
            continue
        else:
            parts.append(f"[{kind}]")
    return "\n".join(parts)
