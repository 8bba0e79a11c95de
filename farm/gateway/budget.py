"""Budgets: when the policy runs out of turns, context or output, its session ends here.

The ONE place that decides what a CLI is told when a budget of the policy's session
runs out, for the three protocols and both modes (engine: :mod:`farm.gateway.service`;
black-box: :mod:`farm.gateway.blackbox`):

- the turn budget (``max_turns`` main turns) is spent: the request is refused before
  the engine is called;
- the context window (``max_context_tokens``) leaves no room for the prompt: refused
  likewise; or the context budget cut the model's output;
- the output budget (``gateway.sampling.max_new_tokens`` or the CLI's own
  ``max_tokens``) cut the model's output.

The CLI gets a normal end of turn: a short final text (the model's own text when the
engine cut it, else :data:`STOP_TEXT`), no tool call, the protocol's ordinary stop
(Anthropic ``end_turn``, Responses ``completed``, Chat ``stop``). That is the reply each
real CLI ends on with exit 0, where the protocol's length stop makes Claude Code exit 1
("response exceeded the ... output token maximum") and Codex fail ("Incomplete response
returned, reason: max_output_tokens"). The session remembers the stop in its record
(``session.record.budget_stop``: its turn tree's or its transcript's); any later main request of it gets
the same end of turn without generating (a sub-agent cut off ends, then its parent
does); the rollout reads the stop and ends ``truncated`` (``farm.rollout.outcome``).

What the CLI is told is not the model's: a refusal records no output ids (no Sample
holds it: ``farm.trajectory.linearize.is_refusal``), and a turn the engine cut keeps
exactly the ids it generated (trained); only the reply differs.
"""

from __future__ import annotations

from dataclasses import replace

from farm.gateway.canonical import TurnOutput
from farm.gateway.config import GatewayConfig
from farm.gateway.sessions import Session
from farm.trajectory.records import Budget, BudgetStop, FinishReason, TurnFlag

STOP_TEXT = "Stopping here: {what} is spent."


def ends_session(config: GatewayConfig, *, side: bool) -> bool:
    """Does a spent budget end the session of this request? For the policy's main requests
    (a side request, e.g. a title, over the context gets the protocol's length stop and the
    session goes on), unless ``gateway.budget_ends_session`` is off (then every request
    gets the length stop, as a hosted API answers)."""
    return not side and config.budget_ends_session


def stopped(session: Session) -> BudgetStop | None:
    """The budget stop that ended ``session``, if one did."""
    return session.record.budget_stop


def stop(session: Session, budget: Budget, limit: int) -> BudgetStop:
    """End ``session`` for ``budget`` (the first stop is kept); returns the stop in force."""
    record = session.record
    if record.budget_stop is None:
        record.budget_stop = BudgetStop(budget=budget, limit=limit, turns=session.stats.main_turns)
        session.stats.budget_stops += 1
    return record.budget_stop


def output_budget(*, context_capped: bool, max_new_tokens: int, max_context_tokens: int) -> tuple[Budget, int]:
    """Which budget cut a turn that finished with ``length``: the context window when its
    room was the binding cap on ``max_new_tokens``, else the output budget."""
    if context_capped:
        return Budget.CONTEXT, max_context_tokens
    return Budget.OUTPUT, max_new_tokens


def end_of_turn(out: TurnOutput | None, budget_stop: BudgetStop) -> TurnOutput:
    """What the CLI gets once a budget ran out: ``out`` (the model's cut turn, or None for a
    refusal) as a normal final answer. Its text is kept (the model's own words, cut where
    the budget cut them); tool calls are dropped (the session is over: none would be run);
    an empty text becomes :data:`STOP_TEXT` (some CLIs want a final text)."""
    text = STOP_TEXT.format(what=f"the {budget_stop.what}")
    if out is None:
        return TurnOutput(turn_id=None, content=text, reasoning=None, tool_calls=(), finish=FinishReason.STOP,
                          flags=frozenset({TurnFlag.BUDGET_STOP}))  # fmt: skip
    return replace(out, content=out.content if out.content.strip() else text, tool_calls=(), matched_stop=None,
                   finish=FinishReason.STOP, flags=out.flags | {TurnFlag.BUDGET_STOP})  # fmt: skip
