"""Control tokens inside content: what a repository prints stays text.

The model's special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, ...) are
control: the chat template writes them around messages. Text inside a message (user
text, a tool result, a file the agent read, tool-call arguments echoed back, the system
prompt, a tool's description) may hold the same characters, and a tokenizer that
encodes the rendered string whole turns them into the control tokens themselves: a
repository that prints ``<|im_end|>`` closes the turn in the model's context, and in
its training Samples.

``gateway.special_tokens_in_content: text`` (the default): before a render, each
occurrence of a special token's text in any string of the messages and tools is
swapped for a marker (ASCII letters, digits and ``_``: nothing a template escapes, trims
or splits on), so the template's own special tokens are the only ones in the rendered
string. That string is encoded split at them: each is its id, and each piece between
two of them, markers swapped back, is encoded with special-token extraction off (the
``tokenizers`` library's ``Tokenizer.encode_special_tokens``, the HF wrapper's
``split_special_tokens``), so the content's occurrences become ordinary text tokens
and the text itself is unchanged. A render without an occurrence is encoded as one
string, exactly as before. Pieces always end at a template special token, and an
append-only delta starts right after one (the model's EOS), so
``previous prompt + previous output + delta == full render`` holds under the rule.

``allow``: content is encoded as it always was (its special-token text becomes control
tokens). Either way each occurrence is counted (:func:`count_in`, reported by the
fidelity check as ``special_tokens_in_content``).

Only *special* tokens are protected (those the tokenizer marks ``special``). A model's
other added tokens (Qwen's ``<tool_call>``, ``<think>``) are markup, not turn control,
and stay as the tokenizer encodes them.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Callable, Literal, Sequence

SpecialsRule = Literal["text", "allow"]


def special_token_texts(tokenizer: Any, backend: Any) -> dict[str, int]:
    """The tokenizer's special tokens: text -> id (added tokens marked ``special``)."""
    decoder = None
    if backend is not None and hasattr(backend, "get_added_tokens_decoder"):
        decoder = backend.get_added_tokens_decoder()
    elif hasattr(tokenizer, "added_tokens_decoder"):
        decoder = tokenizer.added_tokens_decoder
    if not decoder:
        return {}
    return {tok.content: int(i) for i, tok in decoder.items() if getattr(tok, "special", False) and tok.content}


class ContentSpecials:
    """Marks special-token text inside messages and tools, and encodes a rendered string
    with those occurrences as text (see the module doc)."""

    def __init__(self, tokenizer: Any, backend: Any, rule: SpecialsRule = "text") -> None:
        self.rule = rule
        self.ids = special_token_texts(tokenizer, backend)
        alternatives = "|".join(re.escape(t) for t in sorted(self.ids, key=len, reverse=True))
        self.pattern = re.compile(alternatives) if alternatives else None
        nonce = secrets.token_hex(6)
        self._marker = f"FARMSPECIAL{nonce}_{{}}_"
        self._marker_re = re.compile(f"FARMSPECIAL{nonce}_(\\d+)_")
        self._tokenizer = tokenizer
        self._text_backend = None
        if backend is not None and self.pattern is not None:
            # heavy: tokenizers
            from tokenizers import Tokenizer

            # a copy: the shared backend keeps extracting special tokens (the template's)
            self._text_backend = Tokenizer.from_str(backend.to_str())
            self._text_backend.encode_special_tokens = True

    # ---- counting ---------------------------------------------------------------------
    def count_in(self, *values: Any) -> int:
        """Occurrences of special-token text in every string of ``values`` (messages, tools)."""
        if self.pattern is None:
            return 0
        return sum(len(self.pattern.findall(s)) for v in values for s in _strings(v))

    # ---- text rule ----------------------------------------------------------------------
    def mark(self, *values: Any) -> tuple[list[Any], list[str]]:
        """``values`` with every special-token text in their strings swapped for a marker
        (copied only where something changed), and the texts swapped, in marker order.
        Under ``allow`` (or with no special token) the values come back as they are."""
        found: list[str] = []
        if self.rule != "text" or self.pattern is None:
            return list(values), found
        search = self.pattern.search
        if not any(search(s) for v in values for s in _strings(v)):  # the common case: nothing to copy
            return list(values), found

        def swap(m: re.Match[str]) -> str:
            found.append(m.group(0))
            return self._marker.format(len(found) - 1)

        def walk(v: Any) -> Any:
            if isinstance(v, str):
                return self.pattern.sub(swap, v) if self.pattern.search(v) else v
            if isinstance(v, dict):
                out = {k: walk(x) for k, x in v.items()}
                return v if all(out[k] is v[k] for k in v) else out
            if isinstance(v, (list, tuple)):
                items = [walk(x) for x in v]
                return v if all(a is b for a, b in zip(items, v)) else type(v)(items)
            return v

        return [walk(v) for v in values], found

    def encode(self, text: str, found: Sequence[str], encode: Callable[[str], list[int]]) -> list[int]:
        """Ids of a rendered ``text`` whose content markers stand for ``found``: the
        template's special tokens as control ids, everything between them (markers
        swapped back) with special-token extraction off. Without markers: ``encode``
        (the usual one-string encoding)."""
        if not found:
            return encode(text)
        assert self.pattern is not None
        ids: list[int] = []
        pos = 0
        for m in self.pattern.finditer(text):
            ids += self._encode_text(self._unmark(text[pos:m.start()], found))
            ids.append(self.ids[m.group(0)])
            pos = m.end()
        ids += self._encode_text(self._unmark(text[pos:], found))
        return ids

    def _unmark(self, piece: str, found: Sequence[str]) -> str:
        return self._marker_re.sub(lambda m: found[int(m.group(1))], piece) if piece else piece

    def _encode_text(self, piece: str) -> list[int]:
        if not piece:
            return []
        if self._text_backend is not None:
            return self._text_backend.encode(piece, add_special_tokens=False).ids
        return self._tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True)


def _strings(v: Any):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _strings(x)
    elif isinstance(v, (list, tuple)):
        for x in v:
            yield from _strings(x)
