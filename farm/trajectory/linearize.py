"""Linearize a session's turn tree into training Samples.

Cost: O(turns x depth) to lay out every chain from lengths, plus the tokens of the
Samples actually emitted (each holds its whole context, so K emitted chains sharing a
long prefix cost K x that prefix: inherent to one-Sample-per-chain).

Chains: a turn's *contiguous* children are those whose prompt starts right after its
full sequence (every append, every clean mount). A chain ends at each turn without a
contiguous child (every leaf; also a turn whose only children were realigned at an
offset inside it). One Sample per chain end, in DFS order over roots and children in
insertion order: ``tokens`` = the root's prompt + for each later turn (its delta
prompt, its output), where a realigned turn first cuts the ids back to its offset, so
every Sample is exactly what the model saw for its last turn.

Training (``loss_mask`` 1) is on output tokens only, each turn in exactly one Sample:
the first chain in DFS order that holds the turn's output intact. Never trained:
prompt-side tokens (template, tool results, user text, drift spans), turns with
``trainable=False`` or ``SIDE_REQUEST``, ``ERROR`` finishes, and outputs cut by a
realigned descendant (they train in their own chain). ``ABORT``/``LENGTH`` outputs
are real model tokens with logprobs and do train (a turn cut by its output or context
budget keeps exactly what the model generated, whatever the CLI was told after it).
A *refusal* (:func:`is_refusal`: the gateway answered at a turn or context limit
without calling the engine) is not a model turn: it belongs to no chain and no Sample
(its parent ends the chain), so the reply the CLI got there never reaches the
tokens, and the policy's real last turn is what the Sample ends with and trains.
``rollout_logprobs`` holds the
engine's logprob on trained tokens and 0.0 elsewhere; a trained turn recorded
without logprobs keeps 0.0 and is listed in ``metadata["missing_logprobs_turns"]``.

Chains with nothing to train (side requests, error-only branches, prefixes whose
turns all trained elsewhere) are dropped by default (``keep_untrained=False``): they
would cost trainer compute for zero gradient and, under ``split``, dilute the reward.
They stay in the tree (and in the rollouts table). ``chain_index`` is the chain's
position among all chains, so it is stable whether or not empty chains are kept.

Reward policies: ``each`` (default) gives every Sample the rollout's reward. Because
every token trains exactly once, ``each`` never double-counts a token, and a
rollout's Samples all share the outcome they jointly produced; ``split`` (reward/K
over the K Samples, like slime) makes a token's reward depend on how many branches
its rollout happened to have (a sub-agent or a compaction would scale down the
reward of every token), which biases group-normalised advantages by tree shape.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from farm.trajectory.records import FinishReason, TurnFlag, TurnRecord
from farm.trajectory.schema import Sample
from farm.trajectory.tree import TurnTree

RewardPolicy = Literal["split", "each"]


class RolloutInfo(BaseModel):
    """Identity and outcome of the rollout a tree belongs to (copied to every Sample)."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str
    run_id: str = ""
    task_id: str = ""
    group_id: str = ""
    sample_index: int = Field(default=0, ge=0, description="index of the rollout in its group")
    group_index: int | None = Field(default=None, description="the group's position in the run's task stream")
    harness: str = ""
    model: str = ""
    status: str = "completed"
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def is_trainable(rec: TurnRecord) -> bool:
    """May this turn's output ever carry loss?"""
    return (
        rec.trainable
        and TurnFlag.SIDE_REQUEST not in rec.flags
        and rec.finish_reason is not FinishReason.ERROR
        and len(rec.output_ids) > 0
    )


def is_refusal(rec: TurnRecord) -> bool:
    """A turn the gateway answered at a limit without calling the engine (the turn budget
    was spent, or the prompt left no room in the context): no model output, so not a
    model turn. It ends no chain and counts as no one's continuation."""
    return not len(rec.output_ids) and bool(rec.flags & {TurnFlag.TURN_LIMIT, TurnFlag.CONTEXT_LIMIT})


def chain_ends(tree: TurnTree) -> list[TurnRecord]:
    """Turns that end a chain, in DFS order (roots, then children, insertion order).
    Refusals (:func:`is_refusal`) end none: their parent does."""
    out: list[TurnRecord] = []
    stack = list(reversed(tree.roots()))
    while stack:
        rec = stack.pop()
        kids = tree.children(rec.turn_id)
        end = rec.sequence_length
        if not is_refusal(rec) and not any(
            (k.prompt_offset is None or k.prompt_offset == end) and not is_refusal(k) for k in kids
        ):
            out.append(rec)
        stack.extend(reversed(kids))
    return out


def chain_layout(chain: list[TurnRecord]) -> tuple[list[tuple[TurnRecord, int, int]], int]:
    """Where each output that survives in the chain's Sample sits ([(turn, start, end)],
    in order), and the Sample's length: from lengths alone, no token is copied (so a
    chain that will not be emitted costs O(turns), not O(tokens))."""
    outs: list[tuple[TurnRecord, int, int]] = []
    total = 0
    for rec in chain:
        off = rec.prompt_offset if rec.prompt_offset is not None else total
        if off < total:  # realigned: cut back to the offset; outputs past it train in their own chain
            total = off
            while outs and outs[-1][2] > off:
                outs.pop()
        total += len(rec.prompt_delta_ids)
        outs.append((rec, total, total + len(rec.output_ids)))
        total += len(rec.output_ids)
    return outs, total


def _tokens_and_spans(chain: list[TurnRecord]) -> tuple[np.ndarray, list[list[int]]]:
    """The chain's Sample tokens (what the model saw for its last turn, plus that turn's
    output) and its drift spans."""
    segs: list[np.ndarray] = []
    spans: list[list[int]] = []
    total = 0
    for rec in chain:
        off = rec.prompt_offset if rec.prompt_offset is not None else total
        if off < total:
            while total > off:
                last = segs.pop()
                total -= len(last)
                if total < off:
                    segs.append(last[: off - total])
                    total = off
            spans = [sp for sp in spans if sp[1] <= off]
        spans.extend([total + a, total + b] for a, b in rec.mask_spans)
        segs += [rec.prompt_delta_ids, rec.output_ids]
        total += len(rec.prompt_delta_ids) + len(rec.output_ids)
    return (np.concatenate(segs) if segs else np.zeros(0, np.int32)), spans


def chain_routing(chain: list[TurnRecord], n: int) -> tuple[np.ndarray | None, list[list[int]]]:
    """The routed experts of a chain's Sample (``n`` tokens): ``[n - 1, layers, top_k]``,
    row i = the experts of position i (SGLang's convention; the last token has none),
    and the spans of positions no turn reported (zeros there).

    Turns are laid out as ``_tokens_and_spans`` lays out their tokens; each turn's rows
    sit at its own positions (``routed_start``...), later turns overwrite earlier ones, and
    a realign that cuts the sequence back to an offset invalidates every row from there:
    re-tokenized context never keeps experts routed for the old tokens."""
    first = next((r.routed_experts for r in chain if r.routed_experts is not None), None)
    if first is None:
        return None, []
    rows = max(0, n - 1)
    dtype = max((r.routed_experts.dtype for r in chain if r.routed_experts is not None), key=lambda d: d.itemsize)
    out = np.zeros((rows, first.shape[1], first.shape[2]), dtype=dtype)
    known = np.zeros(rows, dtype=bool)
    total = 0
    for rec in chain:
        off = rec.prompt_offset if rec.prompt_offset is not None else total
        if off < total:  # realigned: what was routed for the old tokens from here on is void
            known[off:] = False
            out[off:] = 0
        re = rec.routed_experts
        if re is not None and re.shape[1:] == first.shape[1:]:
            a = rec.routed_start
            b = min(a + len(re), rows)
            if b > a:
                out[a:b] = re[: b - a]
                known[a:b] = True
        total = off + len(rec.prompt_delta_ids) + len(rec.output_ids)
    unknown: list[list[int]] = []
    missing = np.flatnonzero(~known)
    if len(missing):
        breaks = np.flatnonzero(np.diff(missing) != 1)
        starts = np.concatenate([[missing[0]], missing[breaks + 1]])
        ends = np.concatenate([missing[breaks], [missing[-1]]]) + 1
        unknown = [[int(a), int(b)] for a, b in zip(starts, ends)]
    return out, unknown


def is_retry(tree: TurnTree, rec: TurnRecord) -> bool:
    """Was ``rec`` a re-sent request: the gateway said so (``meta.mode``), or an earlier
    sibling saw exactly the same prompt."""
    if rec.meta.get("mode") == "retry":
        return True
    if rec.parent_id is None:
        return False
    for sib in tree.children(rec.parent_id):
        if sib is rec:
            return False
        if sib.prompt_offset == rec.prompt_offset and np.array_equal(sib.prompt_delta_ids, rec.prompt_delta_ids):
            return True
    return False


def _kind(tree: TurnTree, chain: list[TurnRecord], is_main: bool, main_root: str | None) -> str:
    """How the chain was formed: ``side`` (only side requests); ``retry`` (it ends in a
    re-sent request); ``main`` (the first chain through the session's last non-side
    turn: where the agent ended); ``branch`` (another chain of the main root: an edited
    history, a first attempt that was retried); ``fork`` (another root: sub-agent,
    compaction, drift fork). Where the agent ended is also ``metadata.final``, whatever
    the label (a session whose last turn was a retry ends in a ``retry`` chain)."""
    if all(TurnFlag.SIDE_REQUEST in r.flags for r in chain):
        return "side"
    if is_retry(tree, chain[-1]):
        return "retry"
    if is_main:
        return "main"
    return "branch" if chain[0].turn_id == main_root else "fork"


def linearize(
    tree: TurnTree,
    info: RolloutInfo,
    *,
    reward_policy: RewardPolicy = "each",
    keep_untrained: bool = False,
) -> list[Sample]:
    """One Sample per chain (see the module doc); O(total tokens) for the session."""
    main = next((r for r in reversed(tree.turns) if TurnFlag.SIDE_REQUEST not in r.flags and not is_refusal(r)), None)
    main_root = tree.chain(main.turn_id)[0].turn_id if main is not None else None
    main_found = False
    assigned: set[str] = set()
    rows: list[dict[str, Any]] = []
    for index, end in enumerate(chain_ends(tree)):
        chain = tree.chain(end.turn_id)
        is_main = not main_found and main is not None and any(r is main for r in chain)
        main_found = main_found or is_main
        outs, length = chain_layout(chain)
        mine = [(rec, a, b) for rec, a, b in outs if rec.turn_id not in assigned and is_trainable(rec)]
        if not mine and not keep_untrained:
            continue  # nothing to train: never built
        # The prompt is everything before the first output the Sample keeps (a realign
        # may cut back into the root's prompt: then the prompt is what the last turn saw).
        p = outs[0][1] if outs else length
        tokens, spans = _tokens_and_spans(chain)
        r = len(tokens) - p
        mask = np.zeros(r, dtype=np.uint8)
        logprobs = np.zeros(r, dtype=np.float32)
        trained: list[str] = []
        versions: list[int] = []
        missing: list[str] = []
        for rec, a, b in mine:
            assigned.add(rec.turn_id)
            trained.append(rec.turn_id)
            mask[a - p : b - p] = 1
            if len(rec.output_logprobs):
                logprobs[a - p : b - p] = rec.output_logprobs
            else:
                missing.append(rec.turn_id)
            if rec.policy_version is not None:
                versions.append(rec.policy_version)
        chain_versions = [v.policy_version for v in chain if v.policy_version is not None]
        meta: dict[str, Any] = dict(info.metadata)
        meta.update(
            final=is_main,
            turn_ids=[t.turn_id for t in chain],
            trained_turn_ids=trained,
            policy_versions=versions,
            flags=sorted({f.value for t in chain for f in t.flags}),
            drift_spans=spans,
            session_drift=tree.drift.model_dump(),
        )
        if missing:
            meta["missing_logprobs_turns"] = missing
        if "fidelity" in end.meta:  # this Sample's context vs a fresh render (farm.gateway.fidelity)
            meta["fidelity"] = end.meta["fidelity"]
        routed, unknown = chain_routing(chain, len(tokens))
        if routed is not None:
            meta["routed_experts"] = {"unknown_spans": unknown}
        rows.append(
            dict(
                run_id=info.run_id, task_id=info.task_id, rollout_id=info.rollout_id, group_id=info.group_id,
                sample_index=info.sample_index, chain_index=index, chain_kind=_kind(tree, chain, is_main, main_root),
                session_id=tree.session_id, harness=info.harness, model=info.model,
                group_index=info.group_index,
                policy_version_min=min(versions or chain_versions) if (versions or chain_versions) else None,
                policy_version_max=max(versions or chain_versions) if (versions or chain_versions) else None,
                tokens=tokens, prompt_length=p, response_length=r, loss_mask=mask, rollout_logprobs=logprobs,
                status=info.status, finish_reason=end.finish_reason.value, num_turns=len(chain), metadata=meta,
                routed_experts=routed,
            )
        )  # fmt: skip
    reward = info.reward
    if reward is not None and reward_policy == "split" and rows:
        reward = reward / len(rows)
    return [Sample(**row, reward=reward) for row in rows]
