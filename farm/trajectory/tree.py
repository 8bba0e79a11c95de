"""``TurnTree``: the turns of one session, as the model saw and produced them.

Normal case (``append``): the caller (the gateway) names the parent turn and gives
only the prompt ids beyond the parent's full sequence; O(new tokens) per turn.
Fallback (``mount``): the caller only has the full prompt and the full canonical
history it was rendered from. The tree finds the turn whose history (+ response) is
the longest prefix of that history (hashed incrementally, so O(history) per mount,
never pairwise), then checks tokens and classifies the case (see ``drift``): clean
append, realign at an offset, or fork as a new root. Every case is counted in
``tree.drift``; nothing is merged silently.

``messages`` on a record is the canonical messages the turn *added* beyond its
parent's history + response (the whole history for a root); ``history(turn_id)``
rebuilds the full list along the chain. Only turns recorded with a ``response`` can be
found as a parent by ``mount`` (a continuation's history must contain that reply).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from farm.errors import TrajectoryError
from farm.trajectory.drift import DriftKind, DriftStats, classify
from farm.trajectory.records import BudgetStop, FinishReason, TurnFlag, TurnRecord, as_ids, as_logprobs
from farm.trajectory.serde import tree_from_dict, tree_to_dict

_SEQ_CACHE = 4  # full sequences kept (the gateway asks for the latest parent's)
_MAX_CANDIDATES = 8  # same-history turns (retries) token-checked per mount


def _digest(prev: bytes, message: Mapping[str, Any]) -> bytes:
    blob = json.dumps(message, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.blake2b(prev + blob.encode(), digest_size=16).digest()


def _seed(tools_digest: str) -> bytes:
    return hashlib.blake2b(b"farm-history:" + tools_digest.encode(), digest_size=16).digest()


class TurnTree:
    """Per-session turn tree. Picklable (it travels to the reducer).

    ``budget_stop``: set when the gateway ended the session because the policy ran out
    of a budget (turns, context, output): the rollout is then ``truncated``. ``failure``
    is always None: the engine fails single turns (the CLI retries them), never a whole
    session as a hosted endpoint can (a black-box session's record, ``Transcript``, has both)."""

    budget_stop: BudgetStop | None = None  # a class default: trees pickled before it existed read None
    failure: tuple[str, str] | None = None  # (endpoint Failure value, reason), as Transcript.failure

    def __init__(self, session_id: str, *, max_realign_tokens: int = 256) -> None:
        self.session_id = session_id
        self.max_realign_tokens = max_realign_tokens
        self.drift = DriftStats()
        self._turns: dict[str, TurnRecord] = {}
        self._children: dict[str, list[str]] = {}
        self._seq_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        # history digest index, built on the first mount() and kept up to date after
        self._hist: dict[str, bytes] | None = None
        self._by_hist: dict[bytes, list[str]] = {}

    # ---- reading ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._turns)

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._turns

    @property
    def turns(self) -> list[TurnRecord]:
        """All turns in insertion order (a parent always precedes its children)."""
        return list(self._turns.values())

    def get(self, turn_id: str) -> TurnRecord:
        try:
            return self._turns[turn_id]
        except KeyError:
            raise TrajectoryError(f"session {self.session_id}: unknown turn {turn_id!r}") from None

    def children(self, turn_id: str) -> list[TurnRecord]:
        self.get(turn_id)
        return [self._turns[c] for c in self._children.get(turn_id, ())]

    def roots(self) -> list[TurnRecord]:
        return [t for t in self._turns.values() if t.parent_id is None]

    def leaves(self) -> list[TurnRecord]:
        """Turns without children, in insertion order."""
        return [t for t in self._turns.values() if not self._children.get(t.turn_id)]

    def chain(self, turn_id: str) -> list[TurnRecord]:
        """Root ... ``turn_id`` (inclusive)."""
        out = [self.get(turn_id)]
        while out[-1].parent_id is not None:
            out.append(self._turns[out[-1].parent_id])
        out.reverse()
        return out

    def sequence_ids(self, turn_id: str) -> np.ndarray:
        """Full prompt + output ids of ``turn_id`` as the model saw/produced them."""
        cached = self._seq_cache.get(turn_id)
        if cached is not None:
            self._seq_cache.move_to_end(turn_id)
            return cached
        rec = self.get(turn_id)
        parent = self._seq_cache.get(rec.parent_id) if rec.parent_id is not None else None
        if parent is not None:
            seq = np.concatenate([parent[: self._offset(rec)], rec.prompt_delta_ids, rec.output_ids])
        else:
            seq = np.concatenate(chain_segments(self.chain(turn_id), self._offset))
        seq.flags.writeable = False
        self._seq_cache[turn_id] = seq
        if len(self._seq_cache) > _SEQ_CACHE:
            self._seq_cache.popitem(last=False)
        return seq

    def prompt_ids(self, turn_id: str) -> np.ndarray:
        rec = self.get(turn_id)
        return self.sequence_ids(turn_id)[: rec.prompt_length]

    def history(self, turn_id: str) -> list[dict[str, Any]]:
        """Full canonical messages along the chain, each turn's response included."""
        out: list[dict[str, Any]] = []
        for rec in self.chain(turn_id):
            out.extend(rec.messages)
            if rec.response is not None:
                out.append(rec.response)
        return out

    def _offset(self, rec: TurnRecord) -> int:
        if rec.prompt_offset is not None:
            return rec.prompt_offset
        return 0 if rec.parent_id is None else self._turns[rec.parent_id].sequence_length

    # ---- writing ---------------------------------------------------------------
    def append(
        self,
        *,
        parent_id: str | None,
        prompt_delta_ids: Sequence[int] | np.ndarray,
        output_ids: Sequence[int] | np.ndarray,
        output_logprobs: Sequence[float] | np.ndarray,
        finish_reason: FinishReason | str,
        messages: Iterable[Mapping[str, Any]] = (),
        response: Mapping[str, Any] | None = None,
        trainable: bool = True,
        flags: Iterable[TurnFlag | str] = frozenset(),
        policy_version: int | None = None,
        timings: Mapping[str, float] | None = None,
        tools_digest: str = "",
        meta: Mapping[str, Any] | None = None,
        turn_id: str | None = None,
        routed_experts: np.ndarray | None = None,
        routed_start: int = 0,
    ) -> TurnRecord:
        """Record a turn whose prompt is ``sequence_ids(parent_id) + prompt_delta_ids``.

        ``messages``: the canonical messages added beyond the parent's history and
        response. ``parent_id=None`` records a root (``prompt_delta_ids`` = full prompt).
        """
        if parent_id is not None and parent_id not in self._turns:
            raise TrajectoryError(f"session {self.session_id}: unknown parent turn {parent_id!r}")
        rec = self._record(
            parent_id=parent_id,
            offset=0 if parent_id is None else self._turns[parent_id].sequence_length,
            prompt_delta_ids=prompt_delta_ids,
            output_ids=output_ids,
            output_logprobs=output_logprobs,
            finish_reason=finish_reason,
            messages=messages,
            response=response,
            trainable=trainable,
            flags=flags,
            policy_version=policy_version,
            timings=timings,
            tools_digest=tools_digest,
            meta=meta,
            turn_id=turn_id,
            routed_experts=routed_experts,
            routed_start=routed_start,
        )
        if parent_id is None:
            self.drift.new_roots += 1
        else:
            self.drift.appended += 1
        return rec

    def mount(
        self,
        *,
        prompt_ids: Sequence[int] | np.ndarray,
        output_ids: Sequence[int] | np.ndarray,
        output_logprobs: Sequence[float] | np.ndarray,
        finish_reason: FinishReason | str,
        messages: Sequence[Mapping[str, Any]] = (),
        response: Mapping[str, Any] | None = None,
        trainable: bool = True,
        flags: Iterable[TurnFlag | str] = frozenset(),
        policy_version: int | None = None,
        timings: Mapping[str, float] | None = None,
        tools_digest: str = "",
        meta: Mapping[str, Any] | None = None,
        turn_id: str | None = None,
        routed_experts: np.ndarray | None = None,
        routed_start: int = 0,
    ) -> TurnRecord:
        """Record a turn from its full prompt and the FULL history it was rendered from.

        Finds the parent by history, checks tokens, and appends (clean), mounts at an
        offset (realign, flag ``DRIFT_REALIGNED``) or starts a new root (fork, flag
        ``DRIFT_FORKED``; or no parent by history at all). ``meta["drift"]`` on the
        record says which, with the candidate parent and offsets.
        """
        prompt = as_ids(prompt_ids)
        messages = tuple(messages)
        parent_id, n_hist, decision = self._find_parent(prompt, messages, tools_digest)
        flags = frozenset(TurnFlag(f) for f in flags)
        meta = dict(meta or {})
        common = dict(
            output_ids=output_ids, output_logprobs=output_logprobs, finish_reason=finish_reason,
            response=response, trainable=trainable, policy_version=policy_version,
            timings=timings, tools_digest=tools_digest, turn_id=turn_id,
            routed_experts=routed_experts, routed_start=routed_start,
        )  # fmt: skip
        if decision is not None and decision.kind is not DriftKind.FORK:
            assert parent_id is not None
            realign = decision.kind is DriftKind.REALIGN
            meta["drift"] = {"kind": decision.kind.value, "parent": parent_id, "offset": decision.offset,
                             "dropped": decision.dropped}  # fmt: skip
            rec = self._record(
                parent_id=parent_id, offset=decision.offset, prompt_delta_ids=prompt[decision.offset :],
                messages=messages[n_hist:], meta=meta,
                flags=flags | {TurnFlag.DRIFT_REALIGNED} if realign else flags,
                mask_spans=(decision.mask_span,) if realign and decision.mask_span[1] else (),
                **common,
            )  # fmt: skip
            if realign:
                self.drift.realigned += 1
                self.drift.realigned_dropped_tokens += decision.dropped
                self.drift.realigned_masked_tokens += decision.mask_span[1] - decision.mask_span[0]
            else:
                self.drift.mounted_clean += 1
            return rec
        if decision is not None:  # fork: a parent by history, tokens drifted too far
            meta["drift"] = {"kind": "fork", "parent": parent_id, "offset": decision.offset,
                             "dropped": decision.dropped}  # fmt: skip
            flags = flags | {TurnFlag.DRIFT_FORKED}
            self.drift.forked += 1
        else:
            meta["drift"] = {"kind": "new_root"}
            self.drift.new_roots += 1
        return self._record(parent_id=None, offset=0, prompt_delta_ids=prompt, messages=messages,
                            flags=flags, meta=meta, **common)  # fmt: skip

    def _record(
        self,
        *,
        parent_id: str | None,
        offset: int,
        prompt_delta_ids: Sequence[int] | np.ndarray,
        output_ids: Sequence[int] | np.ndarray,
        output_logprobs: Sequence[float] | np.ndarray,
        finish_reason: FinishReason | str,
        messages: Iterable[Mapping[str, Any]],
        response: Mapping[str, Any] | None,
        trainable: bool,
        flags: Iterable[TurnFlag | str],
        policy_version: int | None,
        timings: Mapping[str, float] | None,
        tools_digest: str,
        meta: Mapping[str, Any] | None,
        turn_id: str | None,
        mask_spans: tuple[tuple[int, int], ...] = (),
        routed_experts: np.ndarray | None = None,
        routed_start: int = 0,
    ) -> TurnRecord:
        turn_id = turn_id if turn_id is not None else f"t{len(self._turns)}"
        if turn_id in self._turns:
            raise TrajectoryError(f"session {self.session_id}: duplicate turn id {turn_id!r}")
        delta = as_ids(prompt_delta_ids)
        rec = TurnRecord(
            turn_id=turn_id,
            session_id=self.session_id,
            parent_id=parent_id,
            prompt_delta_ids=delta,
            prompt_length=offset + len(delta),
            prompt_offset=offset,
            output_ids=as_ids(output_ids),
            output_logprobs=as_logprobs(output_logprobs),
            finish_reason=FinishReason(finish_reason),
            messages=tuple(dict(m) for m in messages),
            response=dict(response) if response is not None else None,
            tools_digest=tools_digest,
            trainable=trainable,
            flags=frozenset(TurnFlag(f) for f in flags),
            policy_version=policy_version,
            timings=dict(timings or {}),
            mask_spans=mask_spans,
            meta=dict(meta or {}),
            routed_experts=routed_experts,
            routed_start=routed_start,
        )
        self._turns[turn_id] = rec
        self._children[turn_id] = []
        if parent_id is not None:
            self._children[parent_id].append(turn_id)
        if self._hist is not None:
            self._index(rec)
        return rec

    # ---- history index (mount) -------------------------------------------------
    def _index(self, rec: TurnRecord) -> None:
        assert self._hist is not None
        h = self._hist[rec.parent_id] if rec.parent_id is not None else _seed(rec.tools_digest)
        for m in rec.messages:
            h = _digest(h, m)
        if rec.response is not None:
            h = _digest(h, rec.response)
        self._hist[rec.turn_id] = h
        if rec.response is not None:  # only a turn with a known reply can be continued
            self._by_hist.setdefault(h, []).append(rec.turn_id)

    def _find_parent(self, prompt: np.ndarray, messages: tuple[Mapping[str, Any], ...], tools_digest: str):
        """(parent_id, #history messages it covers, decision) or (None, 0, None)."""
        if self._hist is None:
            self._hist = {}
            for rec in self._turns.values():
                self._index(rec)
        prefix = [_seed(tools_digest)]
        for m in messages:
            prefix.append(_digest(prefix[-1], m))
        for n in range(len(messages), 0, -1):
            ids = self._by_hist.get(prefix[n])
            if not ids:
                continue
            best: tuple[str, Any] | None = None
            for cand in reversed(ids[-_MAX_CANDIDATES:]):
                decision = classify(self.sequence_ids(cand), prompt, self.max_realign_tokens)
                if decision.kind is DriftKind.CLEAN:
                    return cand, n, decision
                if best is None or (best[1].kind is DriftKind.FORK and decision.kind is DriftKind.REALIGN):
                    best = (cand, decision)
            assert best is not None
            return best[0], n, best[1]
        return None, 0, None

    # ---- serialisation ---------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_seq_cache"] = OrderedDict()
        state["_hist"], state["_by_hist"] = None, {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (ids as lists). ``from_dict`` inverts it."""
        return tree_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnTree:
        return tree_from_dict(cls, data)

    @classmethod
    def _restore(cls, session_id: str, max_realign_tokens: int, drift: DriftStats, records: Iterable[TurnRecord],
                 budget_stop: BudgetStop | None = None) -> TurnTree:
        tree = cls(session_id, max_realign_tokens=max_realign_tokens)
        tree.drift = drift
        tree.budget_stop = budget_stop
        for rec in records:
            if rec.parent_id is not None and rec.parent_id not in tree._turns:
                raise TrajectoryError(f"turn {rec.turn_id}: parent {rec.parent_id!r} not restored before it")
            tree._turns[rec.turn_id] = rec
            tree._children[rec.turn_id] = []
            if rec.parent_id is not None:
                tree._children[rec.parent_id].append(rec.turn_id)
        return tree


def chain_segments(chain: Sequence[TurnRecord], offset_of) -> list[np.ndarray]:
    """Id segments of a root-to-turn chain, honouring realigned offsets.

    A realigned turn cuts the accumulated ids to its ``prompt_offset`` first; cuts
    only pop segments pushed before, so the cost is O(turns + cut tokens).
    """
    segs: list[np.ndarray] = []
    total = 0
    for rec in chain:
        off = offset_of(rec)
        while total > off:
            last = segs.pop()
            total -= len(last)
            if total < off:
                segs.append(last[: off - total])
                total = off
        segs.append(rec.prompt_delta_ids)
        segs.append(rec.output_ids)
        total += len(rec.prompt_delta_ids) + len(rec.output_ids)
    return segs
