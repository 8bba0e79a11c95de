"""Whole renders tokenized piece by piece, each piece's ids kept by its text.

A rendered conversation is the template's special tokens (``<|im_start|>``, ``<|im_end|>``)
with text between them: a system prompt with the tool list, each message's body. A
``tokenizers`` tokenizer extracts its special tokens from a string before anything else
(normalization, pre-tokenization, the model) sees it, and encodes what lies between them
each on its own: so ``encode(render) == ids of the pieces and of the specials, in order``.
The append-only path already rests on that (a turn's delta, encoded alone, starts right
after the model's end-of-turn token).

The pieces repeat: every rollout of a harness on an environment starts with the same system
prompt and tools (tens of thousands of tokens: the bulk of a first turn's whole render), a
group's rollouts share their instruction, and the fidelity check's whole render at a
session's close is made of pieces its turns already encoded (tool results, the first
prompt); only the model's own replies are new there. ``PieceCache`` keeps the ids of pieces
of at least ``MIN_CHARS`` characters by their text (least recently used out first, up to
``max_chars`` characters of keys), so a whole render tokenizes only the pieces it has not
seen. Tokenizing the same text gives the same ids, so nothing the engine sees or a
Sample holds changes.

``PieceCache.exact_for`` checks a tokenizer before it is used this way: its special tokens
must not absorb the whitespace around them (``lstrip``/``rstrip``/``single_word``) and a
probe text must encode the same whole and by pieces (a pre-tokenizer that treats a
string's start apart, such as a Metaspace prefix on the first word, fails it); otherwise
renders are tokenized whole, as before.
"""

from __future__ import annotations

import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

MIN_CHARS = 256  # shorter pieces are tokenized every time (cheaper than keeping them)


class PieceCache:
    """Token ids of the text between special tokens, kept by text (see the module doc)."""

    def __init__(self, special_ids: dict[str, int], encode_batch: Callable[[list[str]], list[list[int]]],
                 *, max_chars: int = 8 << 20) -> None:
        self.special_ids = special_ids
        self.pattern = re.compile("|".join(re.escape(t) for t in sorted(special_ids, key=len, reverse=True)))
        self._encode_batch = encode_batch
        self._max_chars = max_chars
        self._kept: OrderedDict[str, array] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # the render thread and the event loop both encode
        self.hits = self.misses = 0

    def encode(self, text: str, *, as_array: bool = False) -> list[int] | array:
        """``text``'s ids: each special token's id, each piece between them from the cache
        or tokenized now (the pieces missing, in one batch). ``as_array``: an ``array("i")``
        (the kept pieces copied as memory, not as Python ints: a whole render of tens of
        thousands of ids is a list built and then turned into an array again otherwise)."""
        parts: list[str | int] = []
        pos = 0
        for m in self.pattern.finditer(text):
            if m.start() > pos:
                parts.append(text[pos:m.start()])
            parts.append(self.special_ids[m.group(0)])
            pos = m.end()
        if pos < len(text):
            parts.append(text[pos:])
        found: dict[str, Sequence[int]] = {}
        todo: list[str] = []
        with self._lock:
            for p in parts:
                if isinstance(p, str) and p not in found:
                    ids = self._kept.get(p) if len(p) >= MIN_CHARS else None
                    if ids is None:
                        todo.append(p)
                        found[p] = ()
                    else:
                        self._kept.move_to_end(p)
                        found[p] = ids
                        self.hits += 1
        if todo:
            fresh = self._encode_batch(todo)
            with self._lock:
                for p, ids in zip(todo, fresh):
                    found[p] = ids
                    if len(p) >= MIN_CHARS:
                        self.misses += 1
                        self._keep(p, ids)
        out = array("i")
        for p in parts:
            if isinstance(p, int):
                out.append(p)
            else:
                out.extend(found[p])  # (a kept array's memory copied whole; a fresh list converted)
        return out if as_array else out.tolist()

    def _keep(self, piece: str, ids: Sequence[int]) -> None:
        if piece in self._kept or len(piece) > self._max_chars // 2:  # one piece never flushes the rest
            return
        self._kept[piece] = array("i", ids)
        self._chars += len(piece)
        while self._chars > self._max_chars:
            old, _ = self._kept.popitem(last=False)
            self._chars -= len(old)

    @classmethod
    def exact_for(cls, backend: Any, special_ids: dict[str, int], probe: str) -> PieceCache | None:
        """A cache for the ``tokenizers`` ``backend``, or None where encoding by pieces could
        differ from encoding whole (see the module doc)."""
        if backend is None or not special_ids:
            return None
        try:
            added = backend.get_added_tokens_decoder().values()
        except Exception:  # noqa: BLE001 - an exotic backend: tokenize whole
            return None
        if any(t.content in special_ids and (t.lstrip or t.rstrip or t.single_word) for t in added):
            return None

        def batch(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]

        cache = cls(special_ids, batch)
        specials = list(special_ids)
        texts = [probe, f" {specials[0]}  lead\n{specials[-1]}\n\n trail ", f"{specials[0]}{specials[-1]}x"]
        for text in texts:
            if cache.encode(text) != backend.encode(text, add_special_tokens=False).ids:
                return None
        cache._kept.clear()
        cache._chars = cache.hits = cache.misses = 0
        return cache
