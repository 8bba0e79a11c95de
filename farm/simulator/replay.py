"""The ``replay`` policy and its recording format (one JSON object per line).

A worker started with ``record_path`` appends one line per finished (not aborted)
response::

    {"routing_key": "sess-1" | null, "turn": 2, "rid": "...",
     "prompt_sha256": "<sha256 of the prompt ids as little-endian int32>",
     "prompt_tokens": 1234, "output_ids": [...], "text": "...",
     "finish_reason": {"type": "stop", "matched": 2}}

``turn`` is the number of assistant turns already in the prompt (0 for the first model
call of a conversation), so it does not depend on retries. Hand-written recordings
may give ``text`` instead of ``output_ids`` (EOS is then appended) and only the keys
they need. Replay looks an output up by, in order: ``rid``, ``prompt_sha256``,
(``routing_key``, ``turn``), then (no routing key, ``turn``) -- entries recorded
without a routing key serve any session. A miss answers a fixed text and is counted (``/farm/stats``).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any, TextIO

from farm.simulator.generation import prompt_digest
from farm.simulator.policy import PolicyReply, PolicyRequest

MISS_TEXT = "(replay: no recorded output for this request)"


def count_turns(prompt: str) -> int:
    """Assistant turns before the generation prompt."""
    return max(prompt.count("<|im_start|>assistant") - 1, 0)


@dataclass(frozen=True, slots=True)
class Recorded:
    output_ids: tuple[int, ...] | None
    text: str

    def reply(self) -> PolicyReply:
        if self.output_ids is not None:
            return PolicyReply(output_ids=self.output_ids, eos=False)
        return PolicyReply(text=self.text)


class ReplayPolicy:
    name = "replay"

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.by_rid: dict[str, Recorded] = {}
        self.by_prompt: dict[str, Recorded] = {}
        self.by_turn: dict[tuple[str | None, int], Recorded] = {}
        for e in entries:
            ids = e.get("output_ids")
            rec = Recorded(tuple(int(i) for i in ids) if ids is not None else None, str(e.get("text", "")))
            if e.get("rid"):
                self.by_rid.setdefault(str(e["rid"]), rec)
            if e.get("prompt_sha256"):
                self.by_prompt.setdefault(str(e["prompt_sha256"]), rec)
            if "turn" in e:
                self.by_turn.setdefault((e.get("routing_key"), int(e["turn"])), rec)
        self.misses = 0

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str]) -> "ReplayPolicy":
        entries = []
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        entries.append(json.loads(line))
                    except ValueError as exc:
                        raise ValueError(f"{path}:{lineno}: not JSON: {exc}") from exc
        return cls(entries)

    def respond(self, request: PolicyRequest) -> PolicyReply:
        rec = self.by_rid.get(request.rid) or self.by_prompt.get(prompt_digest(request.input_ids))
        if rec is None:
            turn = count_turns(request.prompt)
            rec = self.by_turn.get((request.routing_key, turn)) or self.by_turn.get((None, turn))
        if rec is None:
            self.misses += 1
            return PolicyReply(text=MISS_TEXT)
        return rec.reply()


class Recorder:
    """Appends finished responses in the replay format (one flushed line each)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        """Opens the file at once (its directory made if missing): a path that cannot be
        written fails the worker's start with this message, not every rollout later."""
        self.path = str(path)
        self._lock = threading.Lock()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fh: TextIO | None = open(self.path, "a", encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"engine.simulator.record_path {self.path!r} cannot be opened for appending: {exc}") from None

    def write(self, request: PolicyRequest, output_ids: list[int], text: str, finish_reason: dict[str, Any]) -> None:
        entry = {
            "routing_key": request.routing_key,
            "turn": count_turns(request.prompt),
            "rid": request.rid,
            "prompt_sha256": prompt_digest(request.input_ids),
            "prompt_tokens": len(request.input_ids),
            "output_ids": list(output_ids),
            "text": text,
            "finish_reason": finish_reason,
        }
        with self._lock:
            if self._fh is None:
                self._fh = open(self.path, "a", encoding="utf-8")
            self._fh.write(json.dumps(entry) + "\n")
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
