"""Whole renders tokenized by pieces (farm.gateway.pieces): the same ids as one-string
encoding, first time and from the cache, and a tokenizer that could differ is refused."""

from __future__ import annotations

import numpy as np

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from farm.gateway.pieces import MIN_CHARS, PieceCache
from farm.gateway.render import PromptRenderer

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
LONG = "You are a coding agent. Run tools, read files, write patches.\n" * 12  # > MIN_CHARS
TOOLS = [{"type": "function", "function": {"name": "Bash", "description": "run a command " * 30,
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]


def whole(r: PromptRenderer, msgs, tools) -> list[int]:
    return r._backend.encode(r.render_text(msgs, tools), add_special_tokens=False).ids


def conversation(system: str, user: str, result: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}]},
            {"role": "tool", "tool_call_id": "c0", "content": result}]  # fmt: skip


def test_a_whole_render_by_pieces_is_the_one_string_encoding_and_repeats_from_the_cache(hf_tokenizer):
    r = PromptRenderer(hf_tokenizer)
    assert r.pieces is not None
    msgs = conversation(LONG, "fix the bug " * 40, "a.py\nb.py\n" * 60)
    first = r.full_prompt(msgs, TOOLS)
    assert first == whole(r, msgs, TOOLS)
    misses = r.pieces.misses
    assert misses >= 2 and r.pieces.hits == 0  # the system prompt with its tools, the user text, the result
    again = r.prompt_ids(msgs, TOOLS)  # what the gateway takes: int32, built from the kept pieces
    assert again.dtype == np.int32 and again.tolist() == first
    assert r.pieces.misses == misses and r.pieces.hits == misses
    # another rollout: the same system prompt and tools, its own instruction
    other = conversation(LONG, "another task entirely " * 30, "x" * 10)
    assert r.full_prompt(other, TOOLS) == whole(r, other, TOOLS)
    assert r.pieces.hits == misses + 1


def test_by_pieces_equals_whole_on_any_text(hf_tokenizer):
    r = PromptRenderer(hf_tokenizer)
    assert r.pieces is not None

    @settings(max_examples=150, deadline=None)
    @given(st.text(min_size=0, max_size=400), st.text(min_size=0, max_size=400),
           st.sampled_from(["", " ", "\n", "  \n ", "ü"]))
    def check(a, b, pad):
        text = f"{pad}{a}{pad}<|im_end|>{pad}<|im_start|>{b * 3}{pad}<|endoftext|>{a}{pad}"
        want = r._backend.encode(text, add_special_tokens=False).ids
        assert r.pieces.encode(text) == want
        assert r.pieces.encode(text) == want  # from the cache where a piece was long enough
        assert r.pieces.encode(text, as_array=True).tolist() == want

    check()


def test_the_session_close_render_finds_its_turns_pieces(hf_tokenizer):
    """The fidelity check's whole render: the deltas encoded the tool results already."""
    r = PromptRenderer(hf_tokenizer)
    msgs = conversation(LONG, "fix it", "output line\n" * 40)
    delta = r.delta_ids(msgs[2], msgs[3:])
    assert delta is not None
    hits = r.pieces.hits
    assert r.full_prompt(msgs, TOOLS) == whole(r, msgs, TOOLS)
    assert r.pieces.hits > hits  # the tool result's piece, from the delta


def test_least_recently_used_pieces_go_first():
    calls: list[str] = []

    def batch(texts):
        calls.extend(texts)
        return [[len(t)] for t in texts]

    cache = PieceCache({"<s>": 0}, batch, max_chars=3 * MIN_CHARS)
    a, b, c, d = ("a" * MIN_CHARS, "b" * MIN_CHARS, "c" * MIN_CHARS, "d" * MIN_CHARS)
    assert cache.encode(f"{a}<s>{b}<s>{c}") == [MIN_CHARS, 0, MIN_CHARS, 0, MIN_CHARS]
    cache.encode(a)  # a used again: b is now the oldest
    cache.encode(d)  # over the bound: b goes
    calls.clear()
    cache.encode(f"{a}<s>{c}<s>{d}")
    assert calls == []
    cache.encode(b)
    assert calls == [b]
    assert cache.encode("short<s>") == [5, 0] and "short" in calls  # short pieces: encoded, not kept


def _tokenizer(special: AddedToken, metaspace: bool = False) -> Tokenizer:
    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz ▁\n\t")}
    tok = Tokenizer(models.WordLevel({**vocab, "[UNK]": len(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = (pre_tokenizers.Metaspace(prepend_scheme="first") if metaspace
                         else pre_tokenizers.Split("", behavior="isolated"))
    tok.add_special_tokens([special])
    return tok


def test_a_tokenizer_whose_pieces_could_differ_is_refused():
    probe = "abc <s> def\n<s>ghi"
    ok = _tokenizer(AddedToken("<s>", special=True))
    assert PieceCache.exact_for(ok, {"<s>": ok.token_to_id("<s>")}, probe) is not None
    for flag in ("rstrip", "lstrip", "single_word"):
        tok = _tokenizer(AddedToken("<s>", special=True, **{flag: True}))
        assert PieceCache.exact_for(tok, {"<s>": tok.token_to_id("<s>")}, probe) is None, flag
    meta = _tokenizer(AddedToken("<s>", special=True), metaspace=True)  # "▁" only before the string's start
    assert PieceCache.exact_for(meta, {"<s>": meta.token_to_id("<s>")}, probe) is None
