"""Where a request's prompt comes from: append-only extension, retry, or full render.

:func:`plan_turn` looks at the session's recent leaf turns (``TokenSession.lanes``, newest
first). A request *extends* a lane when its canonical messages are the lane's request
messages (exactly, or up to echo tolerance for assistant messages) + an echo of the
lane's reply (:func:`echo_matches`; an empty reply may be left out) + new messages.
Then ``prompt = sequence(lane) + delta`` where the delta is rendered from the new
messages alone (``PromptRenderer.delta_ids``): O(new tokens). A request identical to a
lane's own request is a *retry*: a sibling with the same parent and prompt.

Anything else (first turn, compaction, sub-agents, edited history, a template that
cannot render incrementally) is a full render; the turn is then recorded with
``TurnTree.mount``, which finds a parent by history and classifies token drift. Before
mounting, echoed assistant messages are swapped for the replies we recorded (found by
tool-call id or text) so the tree's history index can recognise them. Every fallback
is counted with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from farm.gateway.canonical import Message, echo_matches, is_empty_response, messages_equivalent, tools_digest
from farm.gateway.render import PromptRenderer
from farm.gateway.sessions import Lane, TokenSession


NEW_CONVERSATION = "new_conversation"  # no recent turn shares the first message: a root, not a fallback


@dataclass(slots=True)
class TurnPlan:
    mode: Literal["append", "retry", "full"]
    parent_id: str | None  # append / retry: the parent turn (retry: maybe None = a root again)
    prompt_delta_ids: np.ndarray  # append/retry: ids beyond the parent's sequence; full: the whole prompt
    prompt_ids: np.ndarray  # the whole prompt (what the engine gets)
    messages: list[Message]  # what the record adds: new messages (append) or the full history (full)
    tools_digest: str
    fallback_reason: str | None = None
    lane: Lane | None = None  # the lane extended (append) or repeated (retry)

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_ids)

    @property
    def needs_render(self) -> bool:
        return self.mode == "full" and not len(self.prompt_ids)

    def set_prompt(self, ids: list[int] | np.ndarray) -> None:
        """The full render of a ``full`` plan."""
        self.prompt_ids = self.prompt_delta_ids = _ids(ids)


def _prefix_matches(msgs: list[Message], ref: list[Message]) -> bool:
    if msgs == ref:  # the common case: one C-level comparison
        return True
    return len(msgs) == len(ref) and all(messages_equivalent(a, b) for a, b in zip(msgs, ref))


def _ids(values: list[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


_EMPTY = _ids([])


def plan_turn(session: TokenSession, messages: list[Message], tools: list[dict], renderer: PromptRenderer,
              *, max_candidates: int) -> TurnPlan:
    """Decide how to build the prompt of a request (see module doc)."""
    digest = tools_digest(tools)
    reason = NEW_CONVERSATION
    for n, lane in enumerate(reversed(list(session.lanes.values()))):
        if n >= max_candidates:
            reason = "too_many_branches"
            break
        related = bool(lane.request) and bool(messages) and lane.request[0] == messages[0]
        if lane.tools_digest != digest:
            reason = "tools_changed" if related else reason
            continue
        k = len(lane.request)
        if not related:
            continue
        if len(messages) < k or not _prefix_matches(messages[:k], lane.request):
            reason = "history_changed"
            continue
        if len(messages) == k:
            rec = session.tree.get(lane.turn_id)
            parent = rec.parent_id
            if parent is None:
                return TurnPlan("retry", None, rec.prompt_delta_ids, rec.prompt_delta_ids, list(rec.messages),
                                digest, lane=lane)  # fmt: skip
            if rec.prompt_offset == session.tree.get(parent).sequence_length:
                prompt = np.concatenate([session.tree.sequence_ids(parent), rec.prompt_delta_ids])
                return TurnPlan("retry", parent, rec.prompt_delta_ids, prompt, list(rec.messages), digest,
                                lane=lane)  # fmt: skip
            reason = "retry_of_realigned_turn"
            break
        echo = messages[k]
        if echo_matches(lane.response, echo):
            new = messages[k + 1:]
        elif is_empty_response(lane.response) and echo.get("role") != "assistant":
            new = messages[k:]
        else:
            reason = "echo_mismatch"
            continue
        if any(m.get("role") == "assistant" for m in new):
            reason = "assistant_in_delta"
            break
        delta = renderer.delta_ids(lane.response, new, generated_end=lane.generated_end,
                                   limit=session.max_context_tokens)  # fmt: skip
        if delta is None:
            reason = "template_not_incremental"
            break
        delta_ids = _ids(delta)
        prompt = np.concatenate([session.tree.sequence_ids(lane.turn_id), delta_ids])
        return TurnPlan("append", lane.turn_id, delta_ids, prompt, list(new), digest, lane=lane)
    if not renderer.incremental and reason != NEW_CONVERSATION:
        reason = "template_not_incremental"
    return full_plan(messages, digest, reason, session)


def full_plan(messages: list[Message], digest: str, reason: str, session: TokenSession | None = None) -> TurnPlan:
    """A plan whose prompt still has to be rendered in full (``TurnPlan.set_prompt``)."""
    msgs = _swap_echoes(session, messages) if session is not None else list(messages)
    return TurnPlan("full", None, _EMPTY, _EMPTY, msgs, digest, fallback_reason=reason)


def _swap_echoes(session: TokenSession, messages: list[Message]) -> list[Message]:
    """Replace echoed assistant messages by the replies we recorded (so ``mount`` finds parents)."""
    if not any(m.get("role") == "assistant" for m in messages):
        return list(messages)
    by_call: dict[str, Message] = {}
    by_text: dict[str, Message] = {}
    for rec in session.tree.turns:
        resp = rec.response
        if not resp:
            continue
        for tc in resp.get("tool_calls") or ():
            by_call[tc.get("id", "")] = resp
        if resp.get("content"):
            by_text["".join(resp["content"].split())] = resp
    out = []
    for m in messages:
        if m.get("role") == "assistant":
            calls = m.get("tool_calls") or ()
            cand = by_call.get(calls[0].get("id", "")) if calls else by_text.get("".join((m.get("content") or "").split()))
            if cand is not None and echo_matches(cand, m):
                m = cand
        out.append(m)
    return out
