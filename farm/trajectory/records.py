"""TurnRecord: one model call exactly as the model saw it and produced it.

Token ids are numpy arrays (int32) so a 1M-token session linearizes with a few
``np.concatenate`` calls instead of Python-level list copies. A turn that extends a
parent stores only the prompt ids *beyond* the parent's full sequence
(``prompt_delta_ids``): the full prompt of turn k is the parent's prompt + output +
this delta, so memory stays O(total tokens) instead of O(turns x context).
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Sequence

import numpy as np

from farm.errors import TrajectoryError


class FinishReason(str, Enum):
    """Why generation stopped (SGLang's ``meta_info.finish_reason.type`` + ours)."""

    STOP = "stop"  # EOS / stop token / stop string
    LENGTH = "length"  # max_new_tokens or the session's context budget
    ABORT = "abort"  # aborted by the engine or by close_session
    ERROR = "error"  # the engine failed mid-turn (turn kept for the record, never trained)


class TurnFlag(str, Enum):
    """Facts about a turn that training and metrics care about."""

    SIDE_REQUEST = "side_request"  # title / count_tokens / tool-less side channel: never trained
    FULL_RENDER = "full_render"  # prompt rendered from scratch (no append-only parent)
    TOOL_PARSE_ERROR = "tool_parse_error"  # a malformed tool call was returned as text
    CONTEXT_LIMIT = "context_limit"  # cut by the session's context budget
    TURN_LIMIT = "turn_limit"  # refused by the session's max-turns limit
    BUDGET_STOP = "budget_stop"  # a budget ran out here: the gateway told the CLI to end (farm.gateway.budget)
    DRIFT_REALIGNED = "drift_realigned"  # mounted on a parent with masked drift
    DRIFT_FORKED = "drift_forked"  # token drift forced a new root
    RETOKENIZED = "retokenized"  # black-box: ids re-tokenized from a hosted endpoint's text + logprobs (not exact)


class Budget(str, Enum):
    """A budget of the policy's session, enforced by the gateway."""

    MAX_TURNS = "max_turns"  # main (trained) model turns of the session (rollout.max_turns)
    CONTEXT = "context"  # prompt + output tokens of a turn (gateway.max_context_tokens)
    OUTPUT = "output"  # output tokens of one turn (gateway.sampling.max_new_tokens, or the CLI's max_tokens)


_BUDGET_NAMES = {
    Budget.MAX_TURNS: "turn budget (max_turns = {limit})",
    Budget.CONTEXT: "context window ({limit} tokens)",
    Budget.OUTPUT: "output budget ({limit} tokens in one turn)",
}


@dataclass(frozen=True, slots=True)
class BudgetStop:
    """The policy ran out of ``budget`` (whose value was ``limit``) after ``turns`` main
    turns, and the gateway ended its session there: the rollout is ``truncated``."""

    budget: Budget
    limit: int
    turns: int

    @property
    def what(self) -> str:
        """e.g. "turn budget (max_turns = 2)"; a limit of 0 is one farm does not know (a
        hosted endpoint's context window)."""
        name = _BUDGET_NAMES[self.budget]
        return name.format(limit=self.limit) if self.limit else name.split(" (")[0]

    @property
    def reason(self) -> str:
        return f"the policy ran out of its {self.what} after {self.turns} turn(s)"

    def as_dict(self) -> dict[str, Any]:
        return {"budget": self.budget.value, "limit": self.limit, "turns": self.turns}


def as_ids(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a read-only int32 array (no copy when already int32)."""
    arr = np.asarray(values, dtype=np.int32)
    if arr.ndim != 1:
        raise TrajectoryError(f"token ids must be 1-D, got shape {arr.shape}")
    arr.flags.writeable = False
    return arr


def as_logprobs(values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float32)
    if arr.ndim != 1:
        raise TrajectoryError(f"logprobs must be 1-D, got shape {arr.shape}")
    arr.flags.writeable = False
    return arr


@dataclass(frozen=True, slots=True, eq=False)
class TurnRecord:
    """One generation call.

    ``prompt_delta_ids``: the full prompt when ``parent_id`` is None, else only the ids
    after the parent's full sequence (parent prompt + parent output).
    ``messages``: the canonical messages this turn added beyond its parent's history
    (the whole history for a root); ``response``: the canonical assistant message the
    gateway returned for it. ``prompt_length`` is the full prompt length.
    ``mask_spans``: (start, end) offsets inside ``prompt_delta_ids`` that are drift the
    tree realigned over; they are never trained (they are prompt-side anyway) and are
    kept for the drift report.
    ``prompt_offset``: where ``prompt_delta_ids`` starts inside the parent's full
    sequence. Equal to the parent's ``sequence_length`` for an append-only turn (the
    normal case); smaller for a turn the tree *realigned* (its prompt diverged from the
    parent's sequence at that offset: the prompt the model saw is
    ``parent_sequence[:prompt_offset] + prompt_delta_ids``). 0 for a root; None when
    the record was built outside a ``TurnTree`` (then: the parent's sequence length).
    """

    turn_id: str
    session_id: str
    parent_id: str | None
    prompt_delta_ids: np.ndarray
    prompt_length: int
    output_ids: np.ndarray
    output_logprobs: np.ndarray
    finish_reason: FinishReason
    messages: tuple[dict[str, Any], ...] = ()
    response: dict[str, Any] | None = None
    tools_digest: str = ""
    trainable: bool = True
    flags: frozenset[TurnFlag] = frozenset()
    policy_version: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    mask_spans: tuple[tuple[int, int], ...] = ()
    created_at: float = field(default_factory=time.time)
    meta: dict[str, Any] = field(default_factory=dict)
    prompt_offset: int | None = None
    # MoE routing replay: the experts routed at positions [routed_start, sequence_length - 1)
    # of this turn's own sequence (prompt as the model saw it + output), [rows, layers, top_k]
    routed_experts: np.ndarray | None = None
    routed_start: int = 0

    def __post_init__(self) -> None:
        n_out, n_lp = len(self.output_ids), len(self.output_logprobs)
        if n_lp not in (0, n_out):
            raise TrajectoryError(
                f"turn {self.turn_id}: {n_lp} logprobs for {n_out} output ids "
                "(must be equal, or no logprobs at all)"
            )
        if self.parent_id is None and self.prompt_length != len(self.prompt_delta_ids):
            raise TrajectoryError(
                f"root turn {self.turn_id}: prompt_length {self.prompt_length} != "
                f"{len(self.prompt_delta_ids)} prompt ids"
            )
        if self.prompt_offset is not None and (
            self.prompt_offset < 0 or self.prompt_offset + len(self.prompt_delta_ids) != self.prompt_length
        ):
            raise TrajectoryError(
                f"turn {self.turn_id}: prompt_offset {self.prompt_offset} + "
                f"{len(self.prompt_delta_ids)} delta ids != prompt_length {self.prompt_length}"
            )
        if self.prompt_length < len(self.prompt_delta_ids):
            raise TrajectoryError(f"turn {self.turn_id}: prompt_length shorter than its delta")
        if self.routed_experts is not None and (
            self.routed_experts.ndim != 3 or self.routed_start < 0
            or self.routed_start + len(self.routed_experts) != self.sequence_length - 1
        ):
            raise TrajectoryError(
                f"turn {self.turn_id}: routed experts {self.routed_experts.shape} from position {self.routed_start} "
                f"do not cover positions up to {self.sequence_length - 1} (one row per position but the last)"
            )

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A finished rollout's turns travel to the reducer (a Ray call per batch of
        # rollouts), and pickling them field by field the dataclass way (``fields()`` on
        # every record, each id array as its own pickle buffer) was about half of what
        # the call cost each side: the values as one tuple, the 1-D arrays as bytes.
        return _restore_turn, (_turn_state(self),)

    @property
    def sequence_length(self) -> int:
        """Full prompt + output length: what a child turn's prompt starts with."""
        return self.prompt_length + len(self.output_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    def has_flag(self, flag: TurnFlag) -> bool:
        return flag in self.flags


_TURN_FIELDS = tuple(f.name for f in fields(TurnRecord))
_turn_values = operator.attrgetter(*_TURN_FIELDS)
# the read-only 1-D arrays ``as_ids`` / ``as_logprobs`` make: (field index, dtype)
_TURN_ARRAYS = tuple((_TURN_FIELDS.index(name), dtype) for name, dtype in
                     (("prompt_delta_ids", np.int32), ("output_ids", np.int32), ("output_logprobs", np.float32)))


def _turn_state(rec: TurnRecord) -> tuple[Any, ...]:
    values = list(_turn_values(rec))
    for i, dtype in _TURN_ARRAYS:
        values[i] = np.asarray(values[i], dtype=dtype).tobytes()
    return tuple(values)


def _restore_turn(state: tuple[Any, ...]) -> TurnRecord:
    """A pickled ``TurnRecord`` back (already checked when it was built: no ``__post_init__``)."""
    values = list(state)
    for i, dtype in _TURN_ARRAYS:
        values[i] = np.frombuffer(values[i], dtype=dtype)  # read-only, as as_ids / as_logprobs make them
    rec = object.__new__(TurnRecord)
    for name, value in zip(_TURN_FIELDS, values):
        object.__setattr__(rec, name, value)
    return rec
