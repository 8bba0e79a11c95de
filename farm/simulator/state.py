"""Per-worker bookkeeping: request counters (``/farm/stats``) and a tiny prefix cache
so ``meta_info.cached_tokens`` behaves like a radix cache under session affinity."""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

MAX_KEYS = 10000


@dataclass
class Inflight:
    """A running request; ``abort`` is set by ``/abort_request``."""

    rid: str
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    message: str = ""


@dataclass
class WorkerStats:
    requests: int = 0
    by_routing_key: Counter[str] = field(default_factory=Counter)
    finished: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    disconnected: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    versions_served: Counter[str] = field(default_factory=Counter)  # weight version -> replies finished under it
    pauses: int = 0
    rescored: int = 0  # requests paused across a weight update and scored again by the new model

    def on_request(self, routing_key: str | None) -> None:
        self.requests += 1
        if routing_key is not None and (routing_key in self.by_routing_key or len(self.by_routing_key) < MAX_KEYS):
            self.by_routing_key[routing_key] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "by_routing_key": dict(self.by_routing_key),
            "finished": dict(self.finished),
            "faults": dict(self.faults),
            "disconnected": self.disconnected,
            "rejected": self.rejected,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "versions_served": dict(self.versions_served),
            "pauses": self.pauses,
            "rescored": self.rescored,
        }


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class PrefixCache:
    """Remembers recent sequences (prompt + output) by routing key (or rid) and reports
    the longest cached prefix of a new prompt among its key's entry and the most recent
    few. Bounded; ``/flush_cache`` clears it."""

    def __init__(self, max_entries: int = 256, recent: int = 4) -> None:
        self._entries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._max = max_entries
        self._recent = recent

    def match(self, key: str | None, input_ids: Sequence[int]) -> int:
        if not self._entries:
            return 0
        ids = np.asarray(input_ids, dtype=np.int64)
        candidates = list(self._entries.values())[-self._recent:]
        if key is not None and key in self._entries:
            candidates.append(self._entries[key])
        # A prompt is never fully cached: the last token is always computed.
        return min(max(common_prefix(ids, c) for c in candidates), max(len(ids) - 1, 0))

    def store(self, key: str, sequence: Sequence[int]) -> None:
        self._entries.pop(key, None)
        self._entries[key] = np.asarray(sequence, dtype=np.int64)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
