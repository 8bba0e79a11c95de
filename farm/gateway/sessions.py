"""Per-rollout sessions: a secret the CLI presents as its API key, limits, the turn tree.

``SessionTable.open`` issues a random secret; the CLI sends it as ``x-api-key`` or
``Authorization: Bearer``. Unknown, missing or closed secrets are 401. A session only
ever sees its own tree. ``close`` marks the session closed (later requests get 401)
and cancels its in-flight generations (which aborts them at the engine).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from farm.errors import GatewayError, GatewayRequestError
from farm.gateway.canonical import Message, TranslationMemo
from farm.trajectory.transcript import Transcript
from farm.trajectory.tree import TurnTree

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SessionHandle:
    """What the rollout hands its CLI: the secret is the CLI's API key."""

    session_id: str
    secret: str


@dataclass
class SessionStats:
    """Counters for one session (the drift report complements ``tree.drift``)."""

    requests: int = 0
    turns: int = 0  # recorded turns (all kinds)
    main_turns: int = 0  # trainable turns counted against max_turns
    appended: int = 0  # append-only: prompt = parent sequence + rendered delta
    retried: int = 0  # same request as an earlier turn: a sibling with the same prompt
    roots: int = 0  # new conversations (first turn, a sub-agent's first turn): full render, no fallback
    full_renders: int = 0  # fallbacks: full render + tree.mount of a request related to a recent turn
    fallback_reasons: Counter[str] = field(default_factory=Counter)
    side_requests: int = 0
    count_tokens: int = 0
    turn_limit_refusals: int = 0
    context_limited: int = 0
    budget_stops: int = 0  # 1 once a budget ended the session (farm.gateway.budget)
    after_budget_stop: int = 0  # main requests answered with that end of turn again, without generating
    tool_parse_errors: int = 0
    engine_errors: int = 0
    aborted: int = 0
    too_long_refusals: int = 0  # 400 "prompt is too long" (a body whose text cannot fit; farm.gateway.bounds)
    bad_requests: int = 0  # other bounds: nesting, tool results for unknown calls, non-object tool input
    foreign_key_refusals: int = 0  # another session's valid key sent through this session's own socket
    dropped_tools: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["fallback_reasons"] = dict(self.fallback_reasons)
        out["dropped_tools"] = dict(self.dropped_tools)
        return out


@dataclass(eq=False)
class Lane:
    """A recent leaf turn the next request may extend (kept for the append-only fast path)."""

    turn_id: str
    request: list[Message]  # canonical messages of the request that produced it, as the CLI sent them
    response: Message  # the canonical assistant message we returned
    tools_digest: str
    generated_end: str  # the stop text its output ends with (e.g. the EOS text)
    sequence_length: int


@dataclass(eq=False)
class Session:
    session_id: str
    secret: str
    model_name: str
    max_turns: int
    max_context_tokens: int
    policy_version: int | None
    tree: TurnTree
    stats: SessionStats = field(default_factory=SessionStats)
    lanes: OrderedDict[str, Lane] = field(default_factory=OrderedDict)
    inflight: set[asyncio.Task[Any]] = field(default_factory=set)
    closed: bool = False
    seen_tools: bool = False  # a main request carried tools (then tool-less requests are side requests)
    tools_by_digest: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # for farm.gateway.fidelity
    memos: dict[str, TranslationMemo] = field(default_factory=dict)
    bounds_checked: dict[int, Any] = field(default_factory=dict)  # farm.gateway.bounds: nesting already checked
    last_activity: float = field(default_factory=time.monotonic)  # opened, or a request began / ended
    transcript: Transcript | None = None  # black-box mode (a hosted endpoint): the record instead of the tree
    deadline: float | None = None  # time.monotonic() the agent phase ends (black-box retries never wait past it)
    observer: Callable[[str, dict[str, Any]], None] | None = None  # farm.single: turn events, as they happen

    def notify(self, kind: str, **data: Any) -> None:
        """Tell the session's observer (if any) that ``kind`` happened; an observer's bug
        never fails a turn."""
        if self.observer is None:
            return
        try:
            self.observer(kind, data)
        except Exception:  # noqa: BLE001
            log.exception("gateway: session %s's observer failed on %s", self.session_id, kind)

    def memo(self, protocol: str) -> TranslationMemo:
        """The translation memo of this session's last request in ``protocol``."""
        memo = self.memos.get(protocol)
        if memo is None:
            memo = self.memos[protocol] = TranslationMemo()
        return memo

    def add_lane(self, lane: Lane, *, replaces: str | None, keep: int) -> None:
        if replaces is not None:
            self.lanes.pop(replaces, None)
        self.lanes[lane.turn_id] = lane
        while len(self.lanes) > keep:
            self.lanes.popitem(last=False)

    def track(self, task: asyncio.Task[Any]) -> None:
        self.last_activity = time.monotonic()
        self.inflight.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.inflight.discard(task)
        self.last_activity = time.monotonic()

    def idle_s(self) -> float:
        """Seconds since the session last had a model request in flight (0 while one is)."""
        return 0.0 if self.inflight else time.monotonic() - self.last_activity


class SessionTable:
    """All sessions of one gateway, by id and by secret."""

    def __init__(self) -> None:
        self._by_id: dict[str, Session] = {}
        self._by_secret: dict[str, Session] = {}

    def __len__(self) -> int:
        return sum(1 for s in self._by_id.values() if not s.closed)

    def open(self, session_id: str, *, model_name: str, max_turns: int, max_context_tokens: int,
             policy_version: int | None = None, observer: Callable[[str, dict[str, Any]], None] | None = None,
             ) -> Session:
        old = self._by_id.get(session_id)
        if old is not None and not old.closed:
            raise GatewayError(f"session {session_id!r} is already open")
        if old is not None:
            self._by_secret.pop(old.secret, None)
        session = Session(
            session_id=session_id, secret="farm-" + secrets.token_urlsafe(24), model_name=model_name,
            max_turns=max_turns, max_context_tokens=max_context_tokens, policy_version=policy_version,
            tree=TurnTree(session_id), observer=observer,
        )  # fmt: skip
        self._by_id[session_id] = session
        self._by_secret[session.secret] = session
        return session

    def open_ids(self) -> list[str]:
        return [s.session_id for s in self._by_id.values() if not s.closed]

    def get(self, session_id: str) -> Session:
        try:
            return self._by_id[session_id]
        except KeyError:
            raise GatewayError(f"unknown session {session_id!r}") from None

    def authenticate(self, credentials: Iterable[str]) -> Session:
        """The open session one of ``credentials`` belongs to, else 401."""
        creds = [c for c in credentials if c]
        if not creds:
            raise GatewayRequestError("missing API key (x-api-key or Authorization: Bearer)", status=401,
                                      kind="authentication")  # fmt: skip
        closed = False
        for cred in creds:
            session = self._by_secret.get(cred)
            if session is None:
                continue
            if not session.closed:
                return session
            closed = True
        raise GatewayRequestError("session is closed" if closed else "invalid API key", status=401,
                                  kind="authentication")  # fmt: skip

    async def close(self, session_id: str, *, timeout_s: float) -> Session:
        """Close (idempotent): refuse new requests, abort in-flight ones, wait for them."""
        session = self.get(session_id)
        session.closed = True
        pending = [t for t in session.inflight if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=timeout_s)
        session.lanes.clear()
        session.memos.clear()
        return session

    def forget(self, session_id: str) -> None:
        """Drop a closed session entirely (its secret stays refused: it is unknown now)."""
        session = self._by_id.get(session_id)
        if session is not None and session.closed:
            del self._by_id[session_id]
            self._by_secret.pop(session.secret, None)
