"""Per-rollout sessions: a secret the CLI presents as its API key, limits, the session's record.

``SessionTable.open`` issues a random secret; the CLI sends it as ``x-api-key`` or
``Authorization: Bearer``. Unknown, missing or closed secrets are 401. A session only
ever sees its own record. ``close`` marks the session closed (later requests get 401)
and cancels its in-flight generations (which aborts them at the engine).

A session is of one kind, fixed when it opens by the service that serves its turns
(``new_session``), one per :class:`~farm.gateway.endpoints.RolloutMode`:

- :class:`TokenSession` (token-exact, the farm's engine): its ``record`` is a
  :class:`~farm.trajectory.tree.TurnTree`, with the lanes and tool lists its prompt
  plans and fidelity checks need;
- :class:`HostedSession` (black-box, a hosted endpoint): its ``record`` is a
  :class:`~farm.trajectory.transcript.Transcript`, and the endpoint can fail it for good
  (``failure``).

What is common (limits, stats, in-flight turns, observers, the record's budget stop) is
:class:`Session`; the gateway, the app and the budgets see only that.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Protocol

from farm.errors import GatewayError, GatewayRequestError
from farm.gateway.canonical import Message, TranslationMemo
from farm.gateway.endpoints import RolloutMode
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
class Session(ABC):
    """What every session has, whichever kind (:class:`TokenSession`, :class:`HostedSession`)."""

    mode: ClassVar[RolloutMode]
    session_id: str
    secret: str
    model_name: str
    max_turns: int
    max_context_tokens: int
    policy_version: int | None
    stats: SessionStats = field(default_factory=SessionStats)
    inflight: set[asyncio.Task[Any]] = field(default_factory=set)
    closed: bool = False
    seen_tools: bool = False  # a main request carried tools (then tool-less requests are side requests)
    memos: dict[str, TranslationMemo] = field(default_factory=dict)
    last_activity: float = field(default_factory=time.monotonic)  # opened, or a request began / ended
    deadline: float | None = None  # time.monotonic() the agent phase ends (black-box retries never wait past it)
    observer: Callable[[str, dict[str, Any]], None] | None = None  # farm.single: turn events, as they happen

    @property
    @abstractmethod
    def record(self) -> TurnTree | Transcript:
        """What the session recorded (``Gateway.close_session`` returns it): each has the
        ``budget_stop`` that ended the session (farm.gateway.budget), if one did."""

    @property
    def failure(self) -> tuple[str, str] | None:
        """(RolloutStatus value, reason) once the endpoint failed the session for good."""
        return self.record.failure

    def release(self) -> None:
        """Drop what only serves requests to come (the session is closed)."""
        self.memos.clear()

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


@dataclass(eq=False, kw_only=True)
class TokenSession(Session):
    """A token-exact session (the farm's engine, :mod:`farm.gateway.service`): every turn's
    token ids in its tree, linearized into Samples."""

    mode: ClassVar[RolloutMode] = RolloutMode.TOKEN_EXACT
    tree: TurnTree
    lanes: OrderedDict[str, Lane] = field(default_factory=OrderedDict)  # farm.gateway.history's append fast path
    tools_by_digest: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # for farm.gateway.fidelity
    bounds_checked: dict[int, Any] = field(default_factory=dict)  # farm.gateway.bounds: nesting already checked

    @property
    def record(self) -> TurnTree:
        return self.tree

    def add_lane(self, lane: Lane, *, replaces: str | None, keep: int) -> None:
        if replaces is not None:
            self.lanes.pop(replaces, None)
        self.lanes[lane.turn_id] = lane
        while len(self.lanes) > keep:
            self.lanes.popitem(last=False)

    def release(self) -> None:
        super().release()
        self.lanes.clear()


@dataclass(eq=False, kw_only=True)
class HostedSession(Session):
    """A black-box session (a hosted endpoint, :mod:`farm.gateway.blackbox`): canonical
    messages in its transcript, never a Sample; the endpoint can fail it for good."""

    mode: ClassVar[RolloutMode] = RolloutMode.BLACK_BOX
    transcript: Transcript

    @property
    def record(self) -> Transcript:
        return self.transcript


class SessionFactory(Protocol):
    """Makes the session a service serves (``TurnService.new_session``, ``BlackBoxService.new_session``)."""

    def __call__(self, *, session_id: str, secret: str, model_name: str, max_turns: int, max_context_tokens: int,
                 policy_version: int | None, observer: Callable[[str, dict[str, Any]], None] | None) -> Session: ...


def token_session(**fields: Any) -> TokenSession:
    """A token-exact session with an empty turn tree (a SessionFactory)."""
    return TokenSession(tree=TurnTree(fields["session_id"]), **fields)


class SessionTable:
    """All sessions of one gateway, by id and by secret; ``new_session`` makes each (its
    kind: the gateway's service's, token-exact unless given)."""

    def __init__(self, new_session: SessionFactory = token_session) -> None:
        self._new_session = new_session
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
        session = self._new_session(
            session_id=session_id, secret="farm-" + secrets.token_urlsafe(24), model_name=model_name,
            max_turns=max_turns, max_context_tokens=max_context_tokens, policy_version=policy_version,
            observer=observer,
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
        session.release()
        return session

    def forget(self, session_id: str) -> None:
        """Drop a closed session entirely (its secret stays refused: it is unknown now)."""
        session = self._by_id.get(session_id)
        if session is not None and session.closed:
            del self._by_id[session_id]
            self._by_secret.pop(session.secret, None)
