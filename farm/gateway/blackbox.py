"""Black-box turns: the CLI's request goes to a hosted endpoint, not the engine.

``BlackBoxService`` stands where :class:`~farm.gateway.service.TurnService` stands
(the app calls ``begin`` / ``run`` / ``count_tokens`` the same way), so every CLI keeps
its own wire protocol, streaming, keepalives and error shapes. Each turn is sent to
the endpoint in the endpoint's protocol (:mod:`farm.gateway.hosted_wire`) and
recorded in the session's :class:`~farm.trajectory.transcript.Transcript` as
canonical messages with usage and latency: no token ids, so never trainable.

Endpoint errors (after :mod:`farm.gateway.hosted`'s retries):

- context length: the policy ran out of its context window, as on the engine path
  (recorded ``CONTEXT_LIMIT``, the session ended by :mod:`farm.gateway.budget`): the
  policy's own outcome, ``truncated``;
- anything else (401 / 403, 429 / 5xx / timeouts past the retry budget, a refused or
  unreadable reply) fails the session: ``transcript.failure`` keeps the failure's kind
  (``Failure``) and why. The CLI gets the protocol's error; the rollout reads
  ``transcript.failure`` and ends as ``farm.rollout.outcome.outcome_for_endpoint`` says
  (``auth_error`` for a refused key, else ``engine_error``: infrastructure, never graded,
  never a reward-0 row).

Budgets as in the engine path (:mod:`farm.gateway.budget`): past ``max_turns`` main
turns a request is refused (``TURN_LIMIT``), and a main reply the endpoint cut
(``length``: its ``max_tokens``) is recorded as it came; either ends the session, and
the CLI gets a normal end of turn. ``count_tokens`` is refused (the gateway renders
nothing).

Logprobs: when the endpoint returns them (``top_logprobs``) the turn keeps them; when
the endpoint's ``tokenizer`` is also known and its logprob tokens re-tokenize to exactly
one id each (:func:`retokenize`), the ids are kept too and the turn is flagged
``RETOKENIZED``. Either way it stays in the transcripts table: never a Sample, never
mixed with the engine path's exact turns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from farm.errors import GatewayRequestError
from farm.gateway import budget
from farm.gateway.canonical import CanonicalRequest, TurnOutput, assistant_message
from farm.gateway.config import GatewayConfig
from farm.gateway.hosted import EndpointError, Failure, HostedCall, HostedClient
from farm.gateway.hosted_wire import output_cap
from farm.gateway.service import is_side_request
from farm.gateway.endpoints import RolloutMode
from farm.gateway.sessions import HostedSession
from farm.gateway.wire import new_id
from farm.modeltext.toolcalls import ToolCall
from farm.trajectory.records import Budget, FinishReason, TurnFlag
from farm.trajectory.transcript import Transcript, TranscriptTurn

# What the CLI is told, per failure: (HTTP status, protocol-neutral error kind).
_CLI_ERROR = {
    Failure.AUTH: (401, "authentication"),
    Failure.RATE_LIMIT: (429, "rate_limit"),
    Failure.SERVER: (529, "overloaded"),
    Failure.TIMEOUT: (504, "timeout"),
    Failure.REJECTED: (502, "api_error"),
}


@dataclass(slots=True)
class BlackBoxTurn:
    session: HostedSession
    req: CanonicalRequest
    side: bool
    immediate: TurnOutput | None = None
    call_id_prefix: str = "call_"
    flags: set[TurnFlag] = field(default_factory=set)
    prompt_tokens: int = 0  # not known before the endpoint answers


class BlackBoxService:
    mode: ClassVar[RolloutMode] = RolloutMode.BLACK_BOX

    def __init__(self, config: GatewayConfig, client: HostedClient, tokenizer: Any = None) -> None:
        self.config = config
        self.client = client
        self.tokenizer = tokenizer  # the endpoint model's, if known (re-tokenized logprob turns)

    def new_session(self, **fields: Any) -> HostedSession:
        """The sessions it serves: black-box, a transcript each, named after the endpoint."""
        return HostedSession(transcript=Transcript(fields["session_id"], self.client.name), **fields)

    async def begin(self, session: HostedSession, req: CanonicalRequest, *,
                    call_id_prefix: str = "call_") -> BlackBoxTurn:
        session.stats.requests += 1
        side = is_side_request(self.config, session, req)
        if not side:
            session.seen_tools = session.seen_tools or bool(req.tools)
        pending = BlackBoxTurn(session, req, side, call_id_prefix=call_id_prefix)
        ended = None if side else budget.stopped(session)
        if side:
            pending.flags.add(TurnFlag.SIDE_REQUEST)
        elif ended is not None:  # a budget already ended the session: the same end of turn, not recorded
            session.stats.after_budget_stop += 1
            pending.immediate = budget.end_of_turn(None, ended)
        elif session.stats.main_turns >= session.max_turns:
            session.stats.turn_limit_refusals += 1
            pending.flags.add(TurnFlag.TURN_LIMIT)
            if budget.ends_session(self.config, side=False):
                pending.flags.add(TurnFlag.BUDGET_STOP)
                pending.immediate = budget.end_of_turn(None, budget.stop(session, Budget.MAX_TURNS, session.max_turns))
            else:
                pending.immediate = _empty(TurnFlag.TURN_LIMIT)
            self._record(pending, pending.immediate, None)
        return pending

    async def run(self, pending: BlackBoxTurn) -> TurnOutput:
        session = pending.session
        if pending.immediate is not None:
            return pending.immediate
        transcript = session.transcript
        if transcript.failure is not None:  # the endpoint already failed this session for good
            raise GatewayRequestError(transcript.failure[1], status=503, kind="overloaded")
        session.notify("turn_started", prompt_tokens=0, side=pending.side)  # a hosted prompt has no count yet
        try:
            call = await self.client.complete(pending.req, deadline=session.deadline)
        except EndpointError as exc:
            if exc.failure is Failure.CONTEXT_LENGTH:
                session.stats.context_limited += 1
                pending.flags.add(TurnFlag.CONTEXT_LIMIT)
                if not budget.ends_session(self.config, side=pending.side):  # an empty length reply, the session goes on
                    out = _empty(TurnFlag.CONTEXT_LIMIT)
                    self._record(pending, out, None, attempts=exc.attempts)
                    return out
                pending.flags.add(TurnFlag.BUDGET_STOP)
                out = budget.end_of_turn(None, budget.stop(session, Budget.CONTEXT, 0))
                self._record(pending, out, None, attempts=exc.attempts)
                return out
            session.stats.engine_errors += 1
            reason = f"hosted endpoint failed ({exc.failure.value}): {exc}"
            transcript.errors.append(reason)
            if not pending.side:  # what the rollout ends as is farm.rollout.outcome's (outcome_for_endpoint)
                transcript.failure = transcript.failure or (exc.failure.value, reason)
            code, kind = _CLI_ERROR[exc.failure]
            raise GatewayRequestError(str(exc), status=code, kind=kind) from exc
        reply = call.reply
        prefix = pending.call_id_prefix
        calls = tuple(c if c.id else ToolCall(id=new_id(prefix), name=c.name, arguments=c.arguments)
                      for c in reply.tool_calls)  # fmt: skip
        # the endpoint's max_tokens cut the policy's turn
        cut = reply.finish is FinishReason.LENGTH and budget.ends_session(self.config, side=pending.side)
        if cut:
            pending.flags.add(TurnFlag.BUDGET_STOP)
        out = TurnOutput(
            turn_id=None, content=reply.content, reasoning=reply.reasoning, tool_calls=calls, finish=reply.finish,
            prompt_tokens=reply.prompt_tokens, output_tokens=reply.output_tokens, cached_tokens=reply.cached_tokens,
            flags=frozenset(pending.flags),
        )  # fmt: skip
        self._record(pending, out, call)  # as the endpoint answered
        if cut:
            limit = output_cap(pending.req, self.client.endpoint) or reply.output_tokens
            return budget.end_of_turn(out, budget.stop(session, Budget.OUTPUT, limit))
        return out

    def _record(self, pending: BlackBoxTurn, out: TurnOutput, call: HostedCall | None, *, attempts: int = 0) -> None:
        session, req = pending.session, pending.req
        ids, logprobs = None, None
        if call is not None and call.reply.logprobs:
            logprobs = [lp for _, lp in call.reply.logprobs]
            ids = retokenize(self.tokenizer, [tok for tok, _ in call.reply.logprobs])
            if ids is not None:
                pending.flags.add(TurnFlag.RETOKENIZED)
        session.transcript.turns.append(TranscriptTurn(
            messages=list(req.messages), tools=[t["function"]["name"] for t in req.tools],
            response=assistant_message(out.content, out.reasoning, out.tool_calls), finish_reason=out.finish,
            protocol=req.protocol, model=(call.reply.model if call else "") or self.client.endpoint.model,
            prompt_tokens=out.prompt_tokens, output_tokens=out.output_tokens, cached_tokens=out.cached_tokens,
            latency_ms=call.latency_ms if call else 0.0, attempts=call.attempts if call else attempts,
            flags=frozenset(pending.flags), output_ids=ids, output_logprobs=logprobs,
        ))  # fmt: skip
        turn = session.transcript.turns[-1]
        session.notify("turn_finished", turn_id=f"t{len(session.transcript.turns)}", prompt_tokens=turn.prompt_tokens,
                       new_prompt_tokens=turn.prompt_tokens, output_tokens=turn.output_tokens,
                       finish_reason=turn.finish_reason.value, side=pending.side, trainable=False,
                       tool_calls=list(turn.response.get("tool_calls") or []))  # fmt: skip
        session.stats.turns += 1
        if pending.side:
            session.stats.side_requests += 1
        elif not pending.flags & {TurnFlag.TURN_LIMIT, TurnFlag.CONTEXT_LIMIT} or out.output_tokens:
            session.stats.main_turns += 1  # a model turn (a refusal at a limit is none)
        session.last_activity = time.monotonic()

    async def count_tokens(self, session: HostedSession, req: CanonicalRequest) -> int:
        raise GatewayRequestError("count_tokens is not available in black-box mode (the endpoint's tokenizer is "
                                  "not known)", status=404, kind="not_found")  # fmt: skip

    async def session_closed(self, session: HostedSession) -> None:
        """Nothing to measure: a transcript is the endpoint's reply as it came."""

    async def aclose(self) -> None:
        await self.client.close()


def retokenize(tokenizer: Any, tokens: list[str]) -> list[int] | None:
    """Ids for the endpoint's logprob tokens, or None unless each token text is exactly
    one id of ``tokenizer`` (then the ids and logprobs pair up one to one)."""
    if tokenizer is None or not tokens:
        return None
    ids = tokenizer.encode("".join(tokens), add_special_tokens=False)
    if len(ids) != len(tokens):
        return None
    if any(tokenizer.decode([i]) != tok for i, tok in zip(ids, tokens)):
        return None
    return list(ids)


def _empty(flag: TurnFlag) -> TurnOutput:
    """The engine path's answer at a limit: nothing, ending with the protocol's length reason."""
    return TurnOutput(turn_id=None, content="", reasoning=None, tool_calls=(), finish=FinishReason.LENGTH,
                      flags=frozenset({flag}))  # fmt: skip
