"""The ``scripted`` policy: replies with outputs it is given (for tests).

Replies are consumed in order, from a per-routing-key queue first, then the shared
queue; an empty queue answers ``default``. Feed it in process
(``ScriptedPolicy(["hi", ...])``, ``policy.push(...)``), from a JSONL file
(``{"text": ...}`` / ``{"output_ids": [...], "eos": false}`` / ``{"routing_key": ...}``
per line), or over HTTP on a running worker::

    POST /farm/script {"replies": ["text", {"text": "...", "eos": false}], "routing_key": null}

A reply may also be a callable ``PolicyRequest -> PolicyReply | str``.
"""

from __future__ import annotations

import json
import os
from collections import deque
from typing import Any, Callable, Iterable, Union

from farm.simulator.policy import PolicyReply, PolicyRequest

Reply = Union[str, PolicyReply, Callable[[PolicyRequest], Union[PolicyReply, str]]]


def to_reply(item: Any) -> Reply:
    """A reply from a string, a ``PolicyReply``, a callable or a JSON object."""
    if isinstance(item, (str, PolicyReply)) or callable(item):
        return item
    if isinstance(item, dict):
        ids = item.get("output_ids")
        return PolicyReply(
            text=str(item.get("text", "")),
            output_ids=tuple(int(i) for i in ids) if ids is not None else None,
            eos=bool(item.get("eos", ids is None)),
        )
    raise ValueError(f"not a reply: {item!r}")


def load_replies_jsonl(path: str | os.PathLike[str]) -> list[tuple[str | None, Reply]]:
    out: list[tuple[str | None, Reply]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                obj = json.loads(line)
                key = obj.pop("routing_key", None) if isinstance(obj, dict) else None
                out.append((key, to_reply(obj)))
    return out


class ScriptedPolicy:
    name = "scripted"

    def __init__(self, replies: Iterable[Any] = (), *, default: str = "OK.") -> None:
        self.default = default
        self._queues: dict[str | None, deque[Reply]] = {None: deque()}
        self.requests: deque[PolicyRequest] = deque(maxlen=1000)  # recent requests, for assertions
        for item in replies:
            if isinstance(item, tuple) and len(item) == 2:
                self.push(item[1], routing_key=item[0])
            else:
                self.push(item)

    def push(self, *replies: Any, routing_key: str | None = None) -> None:
        queue = self._queues.setdefault(routing_key, deque())
        queue.extend(to_reply(r) for r in replies)

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def respond(self, request: PolicyRequest) -> PolicyReply:
        self.requests.append(request)
        queue = self._queues.get(request.routing_key)
        if not queue:
            queue = self._queues[None]
        reply: Reply = queue.popleft() if queue else self.default
        if callable(reply) and not isinstance(reply, PolicyReply):
            reply = reply(request)
        return PolicyReply(text=reply) if isinstance(reply, str) else reply
