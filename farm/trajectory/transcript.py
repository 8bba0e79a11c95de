"""A black-box session's record: canonical messages per turn, no token ids.

A hosted endpoint (``endpoint:`` naming an ``openai`` / ``anthropic`` entry) returns
text, not the tokens the model saw and produced, so nothing of it can be trained
token-exact. The gateway records each request/reply as a :class:`TranscriptTurn`
(the canonical request messages, the canonical reply, usage and latency as the
endpoint reported them) in a :class:`Transcript`, which takes the place of the
TurnTree: the reducer writes it to the ``transcripts`` table, never to Samples.
``failure`` is an endpoint failure that ended the session (an auth refusal, retries
exhausted): the rollout's status comes from it, never a policy outcome.

CLIs resend the whole conversation every turn, so a row stores only what is new: a
request that starts with an earlier turn's request messages keeps ``extends_turn`` =
that turn and ``messages`` = the rest (the earlier reply as the CLI echoed it, then the
tool results / user text); :func:`request_messages` rebuilds every full request.
Storage grows with the conversation, not with its square.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from farm.trajectory.records import BudgetStop, FinishReason, TurnFlag

@dataclass(frozen=True, slots=True)
class TranscriptTurn:
    """One request/reply with a hosted endpoint, as canonical messages."""

    messages: list[dict[str, Any]]
    tools: list[str]
    response: dict[str, Any]
    finish_reason: FinishReason
    protocol: str
    model: str
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    latency_ms: float = 0.0
    attempts: int = 1
    flags: frozenset[TurnFlag] = frozenset()
    output_ids: list[int] | None = None  # only with TurnFlag.RETOKENIZED: never token-exact
    output_logprobs: list[float] | None = None

    trainable = False  # never: no token ids (read by the status and count helpers like a TurnRecord's)

    @property
    def side(self) -> bool:
        return TurnFlag.SIDE_REQUEST in self.flags


@dataclass
class Transcript:
    """Every turn of one black-box session, in order."""

    session_id: str
    endpoint: str
    turns: list[TranscriptTurn] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # endpoint failures the CLI was answered with
    failure: tuple[str, str] | None = None  # (its farm.gateway.hosted.Failure value, reason): the session's endpoint broke
    budget_stop: BudgetStop | None = None  # the policy ran out of a budget: the gateway ended the session

    def __len__(self) -> int:
        return len(self.turns)

    def rows(self, *, run_id: str, rollout_id: str, task_id: str) -> list[dict[str, Any]]:
        bases = [_base(self.turns, i) for i in range(len(self.turns))]
        return [
            {
                "run_id": run_id, "rollout_id": rollout_id, "task_id": task_id, "turn_index": i,
                "endpoint": self.endpoint, "model": t.model, "protocol": t.protocol, "side_request": t.side,
                "extends_turn": base,
                "messages": json.dumps(t.messages[len(self.turns[base].messages):] if base is not None else t.messages),
                "tools": json.dumps(t.tools), "response": json.dumps(t.response),
                "finish_reason": t.finish_reason.value, "flags": json.dumps(sorted(f.value for f in t.flags)),
                "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
                "cached_tokens": t.cached_tokens, "latency_ms": round(t.latency_ms, 3), "attempts": t.attempts,
                "output_ids": t.output_ids, "output_logprobs": t.output_logprobs,
            }  # fmt: skip
            for i, (t, base) in enumerate(zip(self.turns, bases))
        ]


def _base(turns: list[TranscriptTurn], i: int, lookback: int = 8) -> int | None:
    """The latest of the few turns before ``i`` whose request messages ``turns[i]``'s start with."""
    msgs = turns[i].messages
    for j in range(i - 1, max(-1, i - 1 - lookback), -1):
        prev = turns[j].messages
        if len(prev) < len(msgs) and msgs[: len(prev)] == prev:
            return j
    return None


def request_messages(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The full request messages of each of one rollout's transcript rows (in turn order)."""
    full: dict[int, list[dict[str, Any]]] = {}
    out = []
    for row in sorted(rows, key=lambda r: r["turn_index"]):
        base = row["extends_turn"]
        msgs = (full[base] if base is not None else []) + json.loads(row["messages"])
        full[row["turn_index"]] = msgs
        out.append(msgs)
    return out


def main_line_messages(session: Any) -> list[dict[str, Any]]:
    """A session's canonical messages so far, tool calls and their results included, the
    same shape whatever the CLI's wire protocol (``farm.single`` serves it as a rollout's
    ``messages()``). A turn tree's main line is the history of its latest trainable turn;
    a black-box :class:`Transcript`'s is its latest main (non-side) request plus the reply.
    ``[]`` for no session or an empty one."""
    if session is None or not len(session):
        return []
    if isinstance(session, Transcript):
        main = [t for t in session.turns if not t.side] or list(session.turns)
        last = main[-1]
        return [*last.messages, last.response]
    main = [t for t in session.turns if t.trainable] or list(session.turns)
    last = max(main, key=lambda t: t.created_at)
    return session.history(last.turn_id)
