"""Prompt rendering with the model's own chat template, full or O(new tokens).

Full render: ``apply_chat_template(messages, tools, add_generation_prompt=True)``,
tokenized as one string (what ``tokenize=True`` does).

Incremental render (append-only turns). The prompt of turn k+1 is
``prompt(k) + output(k) + ids(delta)``. The delta is the text the template writes
after the assistant message of turn k: its end-of-turn tail (``<|im_end|>\\n`` for
ChatML) minus what the model already generated (its EOS), then the new messages and
the generation prompt. We get it WITHOUT re-rendering the history: render a tiny
fixed context ``[user ".", <the assistant message of turn k, reasoning stripped>]``
(r0) and the same context + the new messages with the generation prompt (r1); the
delta is ``tail + r1[len(r0):]``. Cost: the new messages plus the last reply, never
the history.

Limits (checked once per template at construction, see :meth:`verify`): the template
must render a message independently of messages more than one step back and of the
tool list (true for ChatML/Qwen-style templates: tools only change the system
header). A template that fails the check is rendered in full every turn (counted).
Templates that re-write *earlier* turns (Qwen3 drops old ``<think>`` blocks once a new
user query arrives) do not break this: append-only keeps the sequence the model
actually saw, which is what is trained.

Special-token text inside content (a tool result printing ``<|im_end|>``) is encoded as
text, not as the control token, by both renders alike (:mod:`farm.gateway.specials`,
``gateway.special_tokens_in_content``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import numpy as np

from farm.errors import GatewayRequestError
from farm.gateway.canonical import Message
from farm.gateway.pieces import PieceCache
from farm.gateway.specials import ContentSpecials, SpecialsRule

log = logging.getLogger(__name__)

_SENTINEL = "FARM_SENTINEL_7f3a"
# Bounded tokenization (a hostile body must not cost more than a prompt at the limit):
# a text longer than PRECOUNT_CHARS_PER_TOKEN x limit characters is first counted chunk
# by chunk, stopping as soon as the count passes the limit, before it is tokenized for
# real. Prompts average 3-4.5 characters a token: one near the limit with more than 4
# pays the count on top of its (rare: first turn or fallback) full render.
PRECOUNT_CHARS_PER_TOKEN = 4
PRECOUNT_CHUNK_CHARS = 1 << 16


def bounded_chars(limit: int) -> int:
    """Characters of text tokenized without a check: no more work than a prompt at ``limit``."""
    return max(PRECOUNT_CHARS_PER_TOKEN * limit, PRECOUNT_CHUNK_CHARS)
# How much a normalizer may shrink a text before tokenization (NFC/NFKC compose up to
# ~3 code points into one); None: it may delete text (text length bounds nothing).
_NORMALIZER_SHRINK: dict[str, int | None] = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1, "Lowercase": 1,
                                             "Prepend": 1, "Replace": None, "Strip": None,
                                             "StripAccents": None, "Precompiled": None, "BertNormalizer": None}
_ANCHOR_USER: Message = {"role": "user", "content": "."}


def _probe_conversation() -> tuple[list[Message], list[dict[str, Any]]]:
    tools = [
        {"type": "function", "function": {"name": "Bash", "description": "run a command",
                                          "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "Read", "description": "read a file",
                                          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}},
    ]  # fmt: skip

    def call(i: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
        return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}

    msgs: list[Message] = [
        {"role": "system", "content": "You are a probe."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call(0, "Bash", {"command": "ls"}),
                                                                   call(1, "Read", {"path": "a.py"})]},
        {"role": "tool", "tool_call_id": "call_0", "content": "a.py"},
        {"role": "tool", "tool_call_id": "call_1", "content": "print(1)"},
        {"role": "assistant", "content": "", "tool_calls": [call(2, "Bash", {"command": "pytest"})]},
        {"role": "tool", "tool_call_id": "call_2", "content": "1 passed"},
        {"role": "system", "content": "A reminder in the middle."},
        {"role": "user", "content": "Now summarize."},
        {"role": "assistant", "content": "Done: fixed."},
        {"role": "user", "content": "Thanks."},
    ]  # fmt: skip
    return msgs, tools


class PromptRenderer:
    """Renders canonical messages to token ids with one tokenizer's chat template."""

    def __init__(self, tokenizer: Any, *, template_kwargs: dict[str, Any] | None = None, incremental: bool = True,
                 special_tokens_in_content: SpecialsRule = "text"):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self._backend = None
        self._backend = self._fast_backend()
        self.specials = ContentSpecials(tokenizer, self._backend, special_tokens_in_content)
        self.pieces = self._piece_cache()  # whole renders tokenized by pieces, kept (farm.gateway.pieces)
        self.tail = self._find_tail()
        self.incremental = incremental and self.tail is not None and self.verify()
        self.generation_prompt = self._find_generation_prompt()
        head = self.generation_prompt.rsplit("<think>", 1)
        # the template opened <think> and left it open: the output starts inside reasoning
        self.starts_in_reasoning = len(head) == 2 and "</think>" not in head[1]
        self.max_token_chars = self._max_token_chars()

    # ---- bounds -----------------------------------------------------------------------
    def _max_token_chars(self) -> int | None:
        """An upper bound on how many characters of input text one token covers, so that
        ``len(text) // max_token_chars`` is a floor on its token count. From the
        vocabulary's longest entry (byte-level entries are one char per byte, so never
        shorter than what they decode to), times what the normalizer may shrink. None
        when the normalizer may delete text or the tokenizer cannot be inspected."""
        backend = self._backend if self._backend is not None else getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        try:
            norm = json.loads(backend.to_str()).get("normalizer")
            longest = max(len(t) for t in backend.get_vocab(with_added_tokens=True))
        except Exception:  # an exotic tokenizer: no floor, the chunked count still bounds the work
            return None
        shrink: int | None = 1
        for step in (norm.get("normalizers") or [] if norm and norm.get("type") == "Sequence" else [norm] if norm else []):
            factor = _NORMALIZER_SHRINK.get(step.get("type", ""))
            shrink = None if factor is None or shrink is None else shrink * factor
        return None if shrink is None else max(1, longest) * shrink

    def token_floor(self, chars: int) -> int:
        """A floor on the tokens of ``chars`` characters of text (0 if unknown)."""
        return chars // self.max_token_chars if self.max_token_chars else 0

    def check_length(self, text: str, limit: int | None) -> None:
        """Raise ``PromptTooLong`` if ``text`` is longer than a prompt at the limit could
        be (:func:`bounded_chars`) and
        cannot fit in ``limit`` tokens: decided from its length and the longest token
        first, else by counting chunk by chunk and stopping as soon as the count passes
        the limit. Shorter texts are tokenized as usual (a prompt over the limit is then
        refused with the protocol's length stop and recorded, see ``TurnService``)."""
        if limit is None or len(text) <= bounded_chars(limit):
            return  # no more work than a prompt at the limit: tokenized, then refused if over (CONTEXT_LIMIT)
        floor = self.token_floor(len(text))
        if floor > limit:
            raise PromptTooLong(limit, f"its {len(text)} characters are at least {floor} tokens")
        count, start = 0, 0
        while start < len(text):
            end = min(len(text), start + PRECOUNT_CHUNK_CHARS)
            if end < len(text):  # cut where the pre-tokenizer splits anyway (a newline), so counts add up
                cut = text.rfind("\n", start + PRECOUNT_CHUNK_CHARS // 2, end)
                end = cut + 1 if cut >= 0 else end
            count += len(self.encode(text[start:end]))
            if count > limit:
                raise PromptTooLong(limit, f"counted past the limit within its first {end} of {len(text)} characters")
            start = end

    # ---- primitives --------------------------------------------------------------
    def render_text(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None,
                    *, generation: bool = True) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                list(messages), tools=list(tools) if tools else None, tokenize=False,
                add_generation_prompt=generation, **self.template_kwargs,
            )  # fmt: skip
        except Exception as exc:  # jinja2 TemplateError, raise_exception() in templates, bad types
            raise GatewayRequestError(f"the chat template cannot render this conversation: {exc}") from exc

    @property
    def thread_safe(self) -> bool:
        """Renders may run on another thread (the Rust backend is not mutated per call;
        the HF wrapper resets truncation state on every call, so it is not)."""
        return self._backend is not None

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        """Model output as text for the CLI (never re-tokenized; no clean-up of spaces)."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _fast_backend(self) -> Any:
        """The Rust ``tokenizers`` backend, if it encodes exactly like the HF wrapper (it
        skips ~0.3 ms of Python per call); checked on a probe text."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        msgs, tools = _probe_conversation()
        try:
            text = self.render_text(msgs, tools) + " ünïcode\t tabs  and\n\nnewlines <|endoftext|>"
            expect = self.tokenizer.encode(text, add_special_tokens=False)
            ok = (backend.encode(text, add_special_tokens=False).ids == expect
                  and backend.encode_batch([text], add_special_tokens=False)[0].ids == expect)
        except Exception as exc:  # an exotic tokenizer: use the wrapper (same ids, slower)
            log.warning("tokenizer backend probe failed (%s): encoding through the HF wrapper", exc)
            return None
        if not ok:
            log.warning("tokenizer backend encodes differently from the HF wrapper: using the wrapper")
        return backend if ok else None

    def full_prompt(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None,
                    limit: int | None = None) -> list[int]:
        """``prompt_ids`` as a list."""
        return self.prompt_ids(messages, tools, limit).tolist()

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None,
                   limit: int | None = None) -> np.ndarray:
        """The whole conversation + generation prompt (the O(history) path), int32. With the
        Rust backend it tokenizes via ``encode_batch``, which releases the GIL (the gateway
        runs full renders on a thread; the event loop keeps going meanwhile). A text that
        cannot fit in ``limit`` tokens raises ``PromptTooLong`` before it is tokenized."""
        (messages, tools), found = self.specials.mark(messages, tools)
        text = self.render_text(messages, tools, generation=True)
        self.check_length(text, limit)
        return np.asarray(self.specials.encode(text, found, self._encode_long), dtype=np.int32)

    def _encode_long(self, text: str) -> Sequence[int]:
        if self.pieces is not None:
            return self.pieces.encode(text, as_array=True)  # (np.asarray reads it as memory)
        if self._backend is not None:
            return self._backend.encode_batch([text], add_special_tokens=False)[0].ids
        return self.encode(text)

    def _encode_delta(self, text: str) -> list[int]:
        """A delta's ids; by pieces where they are kept, so that the session's whole render
        at close (the fidelity check) finds its tool results already tokenized."""
        return self.pieces.encode(text) if self.pieces is not None else self.encode(text)

    def _piece_cache(self) -> PieceCache | None:
        msgs, tools = _probe_conversation()
        try:
            probe = self.render_text(msgs, tools) + " ünïcode\t tabs  and\n\nnewlines "
        except GatewayRequestError:
            return None
        cache = PieceCache.exact_for(self._backend, self.specials.ids, probe)
        if cache is None and self._backend is not None:
            log.info("tokenizer: whole renders are tokenized whole (by pieces they could differ)")
        return cache

    def count_content_specials(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None) -> int:
        """Occurrences of special-token text inside the messages and tools (whatever the rule)."""
        return self.specials.count_in(messages, tools or [])

    # ---- incremental ---------------------------------------------------------------
    def delta_text(self, anchor: Message, new: Sequence[Message], *,
                   generated_end: str = "") -> tuple[str, list[str]] | None:
        """What follows the model's output of the turn that produced ``anchor``, with the
        special-token texts of the new messages' content marked (and those texts).

        ``generated_end``: the stop text the model's output already ends with (its EOS);
        it is removed from the front of the template's tail. None if the template does
        not allow the incremental render for these messages.
        """
        if not self.incremental or self.tail is None:
            return None
        (ctx, new), found = self.specials.mark([_ANCHOR_USER, _anchor(anchor)], list(new))
        r0 = self.render_text(ctx, generation=False)
        r1 = self.render_text(ctx + new, generation=True)
        if not r1.startswith(r0) or not r0.endswith(self.tail):
            return None
        suffix = self.tail + r1[len(r0):]
        if generated_end and suffix.startswith(generated_end):
            suffix = suffix[len(generated_end):]
        return suffix, found

    def delta_ids(self, anchor: Message, new: Sequence[Message], *, generated_end: str = "",
                  limit: int | None = None) -> list[int] | None:
        delta = self.delta_text(anchor, new, generated_end=generated_end)
        if delta is None:
            return None
        text, found = delta
        self.check_length(text, limit)
        return self.specials.encode(text, found, self._encode_delta)

    def generated_end(self, output_ids: Sequence[int], finish_type: str, matched: Any) -> str:
        """The stop text the output ends with (SGLang keeps the matched stop token in ``output_ids``)."""
        if finish_type != "stop" or not output_ids:
            return ""
        if isinstance(matched, int) and output_ids[-1] == matched:
            return self.decode([matched])
        if isinstance(matched, str):
            return matched
        return ""

    # ---- template checks ---------------------------------------------------------
    def _find_tail(self) -> str | None:
        """The text the template writes after an assistant message's content."""
        try:
            text = self.render_text([_ANCHOR_USER, {"role": "assistant", "content": _SENTINEL}], generation=False)
        except GatewayRequestError:
            return None
        pos = text.rfind(_SENTINEL)
        return None if pos < 0 else text[pos + len(_SENTINEL):]

    def _find_generation_prompt(self) -> str:
        try:
            a = self.render_text([_ANCHOR_USER], generation=False)
            b = self.render_text([_ANCHOR_USER], generation=True)
        except GatewayRequestError:
            return ""
        return b[len(a):] if b.startswith(a) else ""

    def verify(self) -> bool:
        """Incremental deltas == what the full render appends, on a probe conversation."""
        msgs, tools = _probe_conversation()
        assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        try:
            for n, i in enumerate(assistants):
                j = assistants[n + 1] if n + 1 < len(assistants) else len(msgs)
                before = self.render_text(msgs[: i + 1], tools, generation=False)
                after = self.render_text(msgs[:j], tools, generation=True)
                if not before.endswith(self.tail or "\0") or not after.startswith(before):
                    return False
                ctx = [_ANCHOR_USER, _anchor(msgs[i])]
                r0 = self.render_text(ctx, generation=False)
                r1 = self.render_text(ctx + msgs[i + 1 : j], generation=True)
                if not r1.startswith(r0) or r1[len(r0):] != after[len(before):]:
                    return False
        except GatewayRequestError:
            return False
        return True


class PromptTooLong(GatewayRequestError):
    """A prompt that cannot fit in the context limit, found before (or while) tokenizing it."""

    def __init__(self, limit: int, why: str) -> None:
        super().__init__(f"prompt is too long: more than {limit} tokens (max_context_tokens): {why}",
                         status=400, kind="invalid_request")  # fmt: skip
        self.limit = limit


def _anchor(msg: Message) -> Message:
    """The previous reply as context for the delta render: reasoning dropped (templates
    decide whether to show it by the position of the last user query)."""
    out = {k: v for k, v in msg.items() if k != "reasoning_content"}
    out["role"] = "assistant"
    out.setdefault("content", "")
    return out
