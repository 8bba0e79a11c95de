"""The model behind a scripted worker, when it has one (``farm engine serve --model``).

A policy decides what the reply says; a :class:`Scorer` makes it a model's reply: it
samples the token at a policy's :class:`~farm.simulator.policy.Choice` from the
model's distribution and computes the logprob of every token the worker emits (given
the exact prompt ids it received), so the logprobs a trainer recomputes with the same
weights agree with the engine's. ``/update_weights_from_disk`` loads new weights for
real (:meth:`Scorer.load`). The implementation is farm's tiny CPU language model
(``farm.simulator.lm.LMScorer``, built by ``farm engine serve --model``): a test double
for a GPU engine; the engine itself never imports it.

Without a scorer the worker behaves as before: a choice is drawn uniformly among its
options and logprobs are made up (``generation.fake_logprobs``).
"""

from __future__ import annotations

import random
from typing import Callable, Protocol, Sequence

from farm.simulator.policy import PolicyReply
from farm.simulator.protocol import RequestError, SamplingParams


class Scorer(Protocol):
    """One loaded set of weights (immutable: a weight update builds a new one)."""

    path: str
    vocab_size: int

    def logprobs(self, input_ids: Sequence[int], output_ids: Sequence[int], temperature: float) -> list[float]:
        """``log p(output_ids[i] | input_ids + output_ids[:i])`` for every ``i``."""
        ...

    def sample(self, ids: Sequence[int], sampling: SamplingParams, seed: int) -> int:
        """The next token after ``ids``, sampled from the model with ``sampling``."""
        ...

    def load(self, path: str) -> Scorer:
        """The same kind of model with the weights at ``path`` (raises ``ValueError`` if unusable)."""
        ...


def planned_ids(
    reply: PolicyReply,
    input_ids: Sequence[int],
    sampling: SamplingParams,
    *,
    encode: Callable[[str], list[int]],
    decode: Callable[[Sequence[int]], str],
    eos_id: int | None,
    scorer: Scorer | None,
    seed: int,
) -> list[int]:
    """What the model writes for ``reply``: its text (or ids), then at a choice the
    token the model samples (``scorer``) or a uniform pick among the options (no
    scorer), then that option's continuation; EOS last when the reply has one."""
    ids = list(reply.output_ids) if reply.output_ids is not None else encode(reply.text)
    choice = reply.choice
    if choice is not None:
        options = [encode(tok) for tok, _ in choice.options]
        if not options or any(len(o) != 1 for o in options):
            bad = [tok for (tok, _), o in zip(choice.options, options) if len(o) != 1]
            raise RequestError(f"policy choice options must be single tokens, not {bad or 'none'}", 500)
        if scorer is not None:
            token = scorer.sample([*input_ids, *ids], sampling, seed)
        else:
            token = options[random.Random(seed).randrange(len(options))][0]
        ids.append(token)
        ids += encode(choice.continuation(decode([token])))
    if reply.eos and eos_id is not None:
        ids.append(eos_id)
    return ids


def check_ids(scorer: Scorer, ids: Sequence[int]) -> None:
    """SGLang rejects token ids outside the model's vocabulary: so does a worker with a model."""
    if ids and (max(ids) >= scorer.vocab_size or min(ids) < 0):
        raise RequestError(f"input_ids hold token ids outside the model's vocabulary [0, {scorer.vocab_size})")
