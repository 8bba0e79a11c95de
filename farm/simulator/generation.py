"""Decoding a policy's planned tokens the way an SGLang model decodes: SGLang's stop rules.

A policy says what the model *wants* to write (token ids ending in EOS, or rambling on
without one). :func:`apply_stop_rules` walks those ids one token at a time with
SGLang's ``Req.check_finished`` order -- length first, then stop/EOS token ids (unless
``ignore_eos``), then stop strings -- so ``max_new_tokens``, ``stop``,
``stop_token_ids`` and ``ignore_eos`` behave as on a real server. The outcome is fixed
up front; streaming then emits prefixes of it (an abort cuts it short).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from farm.simulator.protocol import SamplingParams, finish_length, finish_stop


@dataclass(frozen=True, slots=True)
class Completion:
    """What the model generates for one request if nothing aborts it."""

    output_ids: list[int]
    finish_reason: dict[str, Any]


def apply_stop_rules(
    planned: Sequence[int],
    params: SamplingParams,
    *,
    eos_ids: frozenset[int],
    max_new_tokens: int,
    decode: Callable[[list[int]], str],
    filler: Sequence[int],
) -> Completion:
    """Walk ``planned`` (then ``filler`` cyclically: a model that never stops) token by token."""
    stop_ids = frozenset() if params.ignore_eos else frozenset(params.stop_token_ids or ()) | eos_ids
    stop_strs = params.stop_strs
    window = max((len(s) for s in stop_strs), default=0) + 4
    out: list[int] = []
    if max_new_tokens <= 0:
        return Completion(out, finish_length(0))
    n_planned = len(planned)
    n_filler = len(filler)
    i = 0
    while True:
        tok = planned[i] if i < n_planned else filler[(i - n_planned) % n_filler]
        i += 1
        out.append(tok)
        if len(out) >= max_new_tokens:
            return Completion(out, finish_length(max_new_tokens))
        if tok in stop_ids:
            return Completion(out, finish_stop(tok))
        if stop_strs:
            tail = decode(out[-window:])
            for s in stop_strs:
                if s in tail:
                    return Completion(out, finish_stop(s))


def final_text(
    decode: Callable[[list[int], bool], str],
    output_ids: list[int],
    finish_reason: dict[str, Any] | None,
    params: SamplingParams,
) -> str:
    """SGLang's detokenizer: drop a matched stop token / cut at a matched stop string
    unless ``no_stop_trim``; ``skip_special_tokens`` as requested."""
    ids = output_ids
    matched = (finish_reason or {}).get("matched")
    trim = not params.no_stop_trim and matched is not None
    if trim and isinstance(matched, int) and ids:
        ids = ids[:-1]
    text = decode(ids, params.skip_special_tokens)
    if trim and isinstance(matched, str):
        pos = text.find(matched)
        if pos >= 0:
            text = text[:pos]
    return text


class IncrementalText:
    """Cumulative text of a growing id list in O(new tokens) per step (SGLang's
    surrogate/read offsets): never ends in a partial UTF-8 character."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._prefix = 0
        self._read = 0
        self.text = ""

    def update(self, ids: list[int]) -> str:
        prefix_text = self._decode(ids[self._prefix:self._read])
        new_text = self._decode(ids[self._prefix:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.text += new_text[len(prefix_text):]
            self._prefix = self._read
            self._read = len(ids)
        return self.text


def prompt_digest(input_ids: Sequence[int]) -> str:
    """sha256 of the prompt ids as little-endian int32 (the replay key)."""
    return hashlib.sha256(np.asarray(input_ids, dtype="<i4").tobytes()).hexdigest()


def fake_logprobs(seed: int, digest: str, n: int, temperature: float) -> list[float]:
    """Plausible per-token logprobs: negative, mostly near 0, deterministic per
    (seed, prompt); a hotter temperature spreads them further."""
    rng = random.Random(f"{seed}:{digest}")
    scale = 0.05 + 0.35 * min(max(temperature, 0.0), 2.0)
    out = []
    for _ in range(n):
        lp = -rng.expovariate(1.0 / scale)
        if rng.random() < 0.03:  # the occasional unlikely token
            lp -= rng.uniform(1.0, 6.0)
        out.append(max(min(lp, -1e-6), -30.0))
    return out


def jittered(base: float, jitter: float, rng: random.Random) -> float:
    if base <= 0:
        return 0.0
    return max(0.0, base * (1.0 + jitter * (2.0 * rng.random() - 1.0)))
