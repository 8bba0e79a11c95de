"""The policy protocol: what a scripted model wants to say for one prompt.

A policy returns a decision (:class:`PolicyReply`); the server carries it out with
SGLang's stop rules, latency and faults. Policies are deterministic per seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Protocol, Sequence

from farm.simulator.protocol import SamplingParams


@dataclass(eq=False)
class PolicyRequest:
    """One ``/generate`` call as a policy sees it."""

    rid: str
    input_ids: Sequence[int]
    sampling: SamplingParams
    routing_key: str | None = None
    decode: Callable[[Sequence[int]], str] = field(default=lambda ids: "", repr=False)

    @cached_property
    def prompt(self) -> str:
        """The prompt text, special tokens included (decoded once, on demand)."""
        return self.decode(self.input_ids)


@dataclass(frozen=True, slots=True)
class Choice:
    """A point where the model itself picks the next token.

    The worker samples one token there: from its model's distribution when it has one
    (``--model``), else uniformly among the options. Each option is ``(token text,
    continuation)``: the token text must be exactly one token; the continuation is the
    text written after it. Any other sampled token is followed by ``otherwise``.
    """

    options: tuple[tuple[str, str], ...]
    otherwise: str = ""

    def continuation(self, token_text: str) -> str:
        return next((cont for tok, cont in self.options if tok == token_text), self.otherwise)


@dataclass(frozen=True, slots=True)
class PolicyReply:
    """``text`` is tokenized (or ``output_ids`` used verbatim); then the ``choice`` (the
    model's sampled token and what follows it), if any; ``eos`` appends the tokenizer's
    EOS. Without EOS the model rambles on until ``max_new_tokens``."""

    text: str = ""
    output_ids: tuple[int, ...] | None = None
    eos: bool = True
    choice: Choice | None = None


class Policy(Protocol):
    name: str

    def respond(self, request: PolicyRequest) -> PolicyReply: ...
