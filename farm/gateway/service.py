"""One model turn, protocol-neutral: plan the prompt, call the engine, parse, record.

:meth:`TurnService.begin` is synchronous and cheap (no awaits, so no other request of
the session interleaves): side-request classification, the prompt plan
(:mod:`farm.gateway.history`), session limits. :meth:`TurnService.run` calls the
engine and records the turn in the session's tree.

Side requests (Claude Code's title request, OpenCode's title request, any tool-less
request in a session whose main requests carry tools, and requests the protocol marks,
e.g. a tool-less structured-output request) are answered normally but recorded as
separate roots, ``trainable=False`` with flag ``SIDE_REQUEST``: they never join or
pollute the main chain and linearize to Samples that train nothing.
``count_tokens`` is answered from a full render and only counted in the session stats.

Limits (:mod:`farm.gateway.budget` decides what the CLI is told): a session past
``max_turns`` main turns is refused before the engine, recorded with ``TURN_LIMIT`` (no
output, not trainable); a prompt at or past ``max_context_tokens`` likewise with
``CONTEXT_LIMIT``; otherwise ``max_new_tokens = min(client's, config's, context
budget)``, and a main turn the engine cuts (``length``) is recorded as generated
(trainable; ``CONTEXT_LIMIT`` when the context budget was the cap). Each of these ends
the session for its budget (``BUDGET_STOP``): the CLI gets a normal end of turn, and
later main requests get it again without generating. A side request over the context
gets an empty length reply and the session goes on. Engine failures are not recorded
(the CLI gets an error and retries, which becomes the turn); aborted turns are not
recorded.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from farm.engine.client import EngineClient, GenerateRequest, GenerateResult
from farm.errors import EngineError, EngineRejected, EngineTimeout, GatewayRequestError
from farm.gateway import budget
from farm.gateway.bounds import check_request
from farm.gateway.canonical import CanonicalRequest, TurnOutput, assistant_message
from farm.gateway.config import GatewayConfig
from farm.gateway.endpoints import RolloutMode
from farm.gateway.fidelity import measure_session
from farm.gateway.history import NEW_CONVERSATION, TurnPlan, full_plan, plan_turn
from farm.gateway.render import PromptRenderer, PromptTooLong
from farm.gateway.sessions import Lane, Session, TokenSession, token_session
from farm.modeltext.toolcalls import ToolCallFormat
from farm.gateway.wire import new_id
from farm.trajectory.records import Budget, FinishReason, TurnFlag

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


@dataclass(slots=True)
class PendingTurn:
    session: TokenSession
    req: CanonicalRequest
    plan: TurnPlan
    side: bool
    max_new_tokens: int = 0
    context_capped: bool = False  # the context budget is the binding cap on max_new_tokens
    immediate: TurnOutput | None = None  # answered without the engine (a limit)
    call_id_prefix: str = "call_"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return self.plan.prompt_length


def is_side_request(config: GatewayConfig, session: Session, req: CanonicalRequest) -> bool:
    """A title request or the like: marked by the protocol, or tool-less where the session's
    main requests carry tools, or carrying a configured side-request marker."""
    if req.side_hint:
        return True
    if req.tools:
        return False
    system = req.system_text()
    return session.seen_tools or any(m in system for m in config.side_request_markers)


class TurnService:
    mode: ClassVar[RolloutMode] = RolloutMode.TOKEN_EXACT
    new_session = staticmethod(token_session)  # the sessions it serves: token-exact, a turn tree each

    def __init__(self, config: GatewayConfig, renderer: PromptRenderer, engine: EngineClient,
                 tool_format: ToolCallFormat) -> None:
        self.config = config
        self.renderer = renderer
        self.engine = engine
        self.tool_format = tool_format
        self._pool: ThreadPoolExecutor | None = None

    # ---- classification ------------------------------------------------------------
    def is_side_request(self, session: TokenSession, req: CanonicalRequest) -> bool:
        return is_side_request(self.config, session, req)

    async def count_tokens(self, session: TokenSession, req: CanonicalRequest) -> int:
        """Prompt length of a full render (on the render thread); only counted in the stats."""
        session.stats.count_tokens += 1
        limit = session.max_context_tokens
        try:
            self._check(session, req)
            if not self.renderer.thread_safe:
                return len(self.renderer.prompt_ids(req.messages, req.tools, limit))
            loop = asyncio.get_running_loop()
            return len(await loop.run_in_executor(self._render_pool(), self.renderer.prompt_ids, req.messages,
                                                  req.tools, limit))  # fmt: skip
        except PromptTooLong:
            session.stats.too_long_refusals += 1
            raise

    def _check(self, session: TokenSession, req: CanonicalRequest) -> None:
        try:
            check_request(req, self.config, self.renderer, session.max_context_tokens, session.bounds_checked)
        except PromptTooLong:
            raise  # counted where it surfaces (begin / count_tokens), like one found while tokenizing
        except GatewayRequestError:
            session.stats.bad_requests += 1
            raise

    # ---- begin -----------------------------------------------------------------
    def prepare(self, session: TokenSession, req: CanonicalRequest, *, call_id_prefix: str = "call_") -> PendingTurn:
        """Classify and plan (synchronous, no other request of the session interleaves).
        A full render is left to :meth:`begin` / :meth:`render` (``pending.plan.needs_render``)."""
        t0 = time.perf_counter()
        stats = session.stats
        stats.requests += 1
        self._check(session, req)
        stats.dropped_tools.update(req.dropped_tools)
        side = self.is_side_request(session, req)
        ended = None if side else budget.stopped(session)
        if ended is not None:  # a budget already ended the session: the same end of turn, nothing generated
            stats.after_budget_stop += 1
            pending = PendingTurn(session, req, full_plan([], "", "budget_stop"), side, call_id_prefix=call_id_prefix)
            pending.immediate = budget.end_of_turn(None, ended)
            return pending
        if side:
            plan = full_plan(req.messages, "", "side_request")
        else:
            session.seen_tools = session.seen_tools or bool(req.tools)
            plan = plan_turn(session, req.messages, req.tools, self.renderer,
                             max_candidates=self.config.max_match_candidates)  # fmt: skip
            session.tools_by_digest.setdefault(plan.tools_digest, list(req.tools))
        pending = PendingTurn(session, req, plan, side, call_id_prefix=call_id_prefix)
        pending.timings["plan_ms"] = (time.perf_counter() - t0) * 1e3
        if not plan.needs_render:
            self._limits(pending)
        return pending

    def render(self, pending: PendingTurn, ids: np.ndarray | None = None) -> PendingTurn:
        """Finish a pending full render (inline unless ``ids`` are given), then apply limits."""
        if pending.plan.needs_render and pending.immediate is None:
            t0 = time.perf_counter()
            if ids is None:
                ids = self.renderer.prompt_ids(pending.req.messages, pending.req.tools,
                                                pending.session.max_context_tokens)  # fmt: skip
            pending.plan.set_prompt(ids)
            pending.timings["render_ms"] = (time.perf_counter() - t0) * 1e3
            self._limits(pending)
        return pending

    async def begin(self, session: TokenSession, req: CanonicalRequest, *,
                    call_id_prefix: str = "call_") -> PendingTurn:
        """:meth:`prepare`, with a full render (O(history)) on the render thread so the
        event loop keeps serving other sessions meanwhile."""
        try:
            pending = self.prepare(session, req, call_id_prefix=call_id_prefix)
            if pending.plan.needs_render and pending.immediate is None:
                if self.renderer.thread_safe:
                    loop = asyncio.get_running_loop()
                    ids = await loop.run_in_executor(self._render_pool(), self.renderer.prompt_ids,
                                                     req.messages, req.tools,
                                                     session.max_context_tokens)  # fmt: skip
                    self.render(pending, ids)
                else:
                    self.render(pending)
        except PromptTooLong:
            session.stats.too_long_refusals += 1
            raise
        return pending

    def _render_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-gateway-render")
        return self._pool

    async def session_closed(self, session: TokenSession) -> None:
        """The closed session's fidelity (``gateway.fidelity``): a full render per Sample."""
        if self.config.fidelity == "off":
            return
        args = (session.tree, self.renderer, session.tools_by_digest, self.config.fidelity)
        if self.renderer.thread_safe:  # off the event loop
            await asyncio.to_thread(measure_session, *args)
        else:
            measure_session(*args)

    def close(self) -> None:
        """Stop the render thread (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def aclose(self) -> None:
        self.close()

    def _limits(self, pending: PendingTurn) -> None:
        session, req, stats = pending.session, pending.req, pending.session.stats
        room = session.max_context_tokens - pending.plan.prompt_length
        if not pending.side and stats.main_turns >= session.max_turns:
            stats.turn_limit_refusals += 1
            pending.immediate = self._refuse(pending, TurnFlag.TURN_LIMIT, Budget.MAX_TURNS, session.max_turns)
        elif room <= 0:
            stats.context_limited += 1
            pending.immediate = self._refuse(pending, TurnFlag.CONTEXT_LIMIT, Budget.CONTEXT,
                                             session.max_context_tokens)  # fmt: skip
        else:
            caps = [c for c in (req.max_tokens, self.config.sampling.max_new_tokens) if c]
            pending.max_new_tokens = min([room, *caps])
            pending.context_capped = room < min(caps)

    def _refuse(self, pending: PendingTurn, flag: TurnFlag, which: Budget, limit: int) -> TurnOutput:
        """Answer at a limit without the engine: recorded with no output (a refusal, in no
        Sample); a main request ends the session for ``which``."""
        empty = GenerateResult(output_ids=[], output_logprobs=[], finish_type="length")
        if not budget.ends_session(self.config, side=pending.side):  # an empty length reply, the session goes on
            return self._record(pending, empty, "", None, (), [], frozenset({flag}), trainable=False)
        stop = budget.stop(pending.session, which, limit)
        told = budget.end_of_turn(None, stop)
        out = self._record(pending, empty, told.content, None, (), [], frozenset({flag, TurnFlag.BUDGET_STOP}),
                           trainable=False)  # fmt: skip
        return budget.end_of_turn(out, stop)

    # ---- run (async) ---------------------------------------------------------------
    def sampling_params(self, pending: PendingTurn) -> dict[str, Any]:
        cfg, req = self.config.sampling, pending.req
        temperature, top_p = cfg.temperature, cfg.top_p
        if not cfg.override_client:
            temperature = req.temperature if req.temperature is not None else temperature
            top_p = req.top_p if req.top_p is not None else top_p
        params: dict[str, Any] = {
            "max_new_tokens": pending.max_new_tokens, "temperature": temperature, "top_p": top_p,
            "top_k": cfg.top_k, "min_p": cfg.min_p, "skip_special_tokens": False, "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }  # fmt: skip
        if cfg.client_stop_sequences and req.stop:
            params["stop"] = list(req.stop)
        if cfg.stop_token_ids:
            params["stop_token_ids"] = list(cfg.stop_token_ids)
        return params

    async def run(self, pending: PendingTurn) -> TurnOutput:
        """Generate and record. Raises ``GatewayRequestError`` (engine failures mapped to
        statuses) or ``CancelledError`` (aborted: nothing recorded)."""
        if pending.immediate is not None:
            return pending.immediate
        session = pending.session
        session.notify("turn_started", prompt_tokens=pending.plan.prompt_length, side=pending.side)
        gen = GenerateRequest(
            input_ids=pending.plan.prompt_ids, sampling_params=self.sampling_params(pending),
            rid=f"{session.session_id}-{uuid.uuid4().hex[:12]}", routing_key=session.session_id,
            routed_experts_start_len=self._routed_start(pending),
        )  # fmt: skip
        try:
            result = await self.engine.generate(gen)
        except asyncio.CancelledError:
            session.stats.aborted += 1
            raise
        except EngineRejected as exc:
            session.stats.engine_errors += 1
            status = exc.status if exc.status in (400, 413, 422) else 400
            raise GatewayRequestError(f"the engine rejected the request: {exc}", status=status) from exc
        except EngineTimeout as exc:
            session.stats.engine_errors += 1
            raise GatewayRequestError(f"the engine timed out: {exc}", status=504, kind="timeout") from exc
        except EngineError as exc:
            session.stats.engine_errors += 1
            raise GatewayRequestError(f"the engine is unavailable: {exc}", status=529, kind="overloaded") from exc
        if session.closed:  # closed while the reply was in flight: the tree is already handed out
            session.stats.aborted += 1
            raise asyncio.CancelledError()
        pending.timings["engine_ms"] = result.engine_ms
        return self._finish(pending, result)

    def _routed_start(self, pending: PendingTurn) -> int | None:
        """Where this turn's routed experts should start (None: routing replay off). An
        appended turn asks only for what its parent does not hold: from the parent's last
        output token (its first position fed forward) on. A full render asks for the whole
        sequence: it may be realigned onto re-tokenized context, where the parent's rows
        would pair old experts with new tokens."""
        if self.engine.config.routed_experts is None:
            return None
        plan = pending.plan
        if plan.mode == "full" or pending.side or plan.parent_id is None:
            return 0
        return max(0, pending.session.tree.get(plan.parent_id).sequence_length - 1)

    def _finish(self, pending: PendingTurn, result: GenerateResult) -> TurnOutput:
        t0 = time.perf_counter()
        ids = result.output_ids
        end = self.renderer.generated_end(ids, result.finish_type, result.matched)
        text_ids = ids[:-1] if end and isinstance(result.matched, int) else ids
        text = self.renderer.decode(text_ids)
        matched_stop = None
        if isinstance(result.matched, str) and result.matched in pending.req.stop:
            matched_stop = result.matched
            cut = text.rfind(result.matched)
            text = text[:cut] if cut >= 0 else text
        prefix = pending.call_id_prefix
        parsed = self.tool_format.parse(text, in_reasoning=self.renderer.starts_in_reasoning,
                                        tools=pending.req.tools, make_id=lambda: new_id(prefix))  # fmt: skip
        flags: set[TurnFlag] = set()
        if parsed.errors:
            flags.add(TurnFlag.TOOL_PARSE_ERROR)
            pending.session.stats.tool_parse_errors += 1
        if result.finish_type == "length" and pending.context_capped:
            flags.add(TurnFlag.CONTEXT_LIMIT)
            pending.session.stats.context_limited += 1
        # a budget ran out inside the policy's turn
        cut = result.finish_type == "length" and budget.ends_session(self.config, side=pending.side)
        if cut:
            flags.add(TurnFlag.BUDGET_STOP)
        pending.timings["parse_ms"] = (time.perf_counter() - t0) * 1e3
        out = self._record(pending, result, parsed.content, parsed.reasoning, parsed.tool_calls,
                           list(parsed.errors), frozenset(flags), trainable=not pending.side,
                           end=end, matched_stop=matched_stop)  # fmt: skip
        if not cut:
            return out
        session = pending.session
        which, limit = budget.output_budget(context_capped=pending.context_capped,
                                            max_new_tokens=pending.max_new_tokens,
                                            max_context_tokens=session.max_context_tokens)  # fmt: skip
        return budget.end_of_turn(out, budget.stop(session, which, limit))

    def _record(self, pending: PendingTurn, result: GenerateResult, content: str, reasoning: str | None,
                calls: Any, errors: list[str], flags: frozenset[TurnFlag], *, trainable: bool,
                end: str = "", matched_stop: str | None = None) -> TurnOutput:
        t0 = time.perf_counter()
        session, plan, req = pending.session, pending.plan, pending.req
        stats, tree = session.stats, session.tree
        response = assistant_message(content, reasoning, calls)
        finish = _FINISH[result.finish_type]
        meta: dict[str, Any] = {"protocol": req.protocol, "model": req.model, "mode": plan.mode}
        for key, val in (("fallback_reason", plan.fallback_reason), ("weight_version", result.weight_version),
                         ("parse_errors", errors), ("dropped_tools", req.dropped_tools),
                         ("engine_attempts", result.attempts if result.attempts > 1 else None),
                         ("routed_bytes", result.routed_bytes)):
            if val:
                meta[key] = val
        if pending.side:
            flags = flags | {TurnFlag.SIDE_REQUEST, TurnFlag.FULL_RENDER}
            trainable = False
        elif plan.mode == "full":
            flags = flags | {TurnFlag.FULL_RENDER}
        common = dict(
            output_ids=result.output_ids, output_logprobs=result.output_logprobs, finish_reason=finish,
            messages=plan.messages, response=response, trainable=trainable, flags=flags,
            policy_version=_policy_version(result.weight_version, session.policy_version), timings=pending.timings, tools_digest=plan.tools_digest, meta=meta,
            routed_experts=result.routed_experts, routed_start=result.routed_start,
        )  # fmt: skip
        if plan.mode == "full" and not pending.side:
            rec = tree.mount(prompt_ids=plan.prompt_ids, **common)
        else:
            rec = tree.append(parent_id=plan.parent_id, prompt_delta_ids=plan.prompt_delta_ids, **common)
        stats.turns += 1
        if trainable:
            stats.main_turns += 1
        if pending.side:
            stats.side_requests += 1
        elif plan.mode == "append":
            stats.appended += 1
        elif plan.mode == "retry":
            stats.retried += 1
        elif plan.fallback_reason == NEW_CONVERSATION:
            stats.roots += 1
        else:
            stats.full_renders += 1
            stats.fallback_reasons[plan.fallback_reason or "unknown"] += 1
        if not pending.side and TurnFlag.BUDGET_STOP not in flags:  # the session goes on from this turn
            replaces = plan.parent_id if plan.mode == "append" else rec.parent_id
            session.add_lane(
                Lane(rec.turn_id, list(req.messages), response, plan.tools_digest, end, rec.sequence_length),
                replaces=replaces, keep=self.config.max_match_candidates,
            )  # fmt: skip
        rec.timings["record_ms"] = (time.perf_counter() - t0) * 1e3
        session.notify("turn_finished", turn_id=rec.turn_id, prompt_tokens=plan.prompt_length,
                       new_prompt_tokens=len(rec.prompt_delta_ids),
                       output_tokens=len(result.output_ids), finish_reason=getattr(finish, "value", finish),
                       side=pending.side, trainable=trainable, tool_calls=list(response.get("tool_calls") or []))
        return TurnOutput(
            turn_id=rec.turn_id, content=content, reasoning=reasoning, tool_calls=tuple(calls), finish=finish,
            matched_stop=matched_stop, prompt_tokens=plan.prompt_length, output_tokens=len(result.output_ids),
            cached_tokens=result.cached_tokens, flags=rec.flags,
        )  # fmt: skip


def _policy_version(weight_version: str | None, session_version: int | None) -> int | None:
    """The policy version that produced this reply.

    The engine's ``meta_info.weight_version`` is exact per reply (the router actor
    stamps ``str(policy_version)`` on every ``update_weights_from_disk``), so it wins;
    a non-numeric or missing one falls back to the version the session was opened with
    (SGLang's ``"default"``, never updated, is version 0 when the session has none).
    """
    if weight_version is not None and weight_version != "default":
        try:
            return int(weight_version)
        except ValueError:
            pass
    if session_version is None and weight_version == "default":
        return 0  # SGLang's stamp before any weight update: the initial weights, farm's version 0
    return session_version
