"""JSON-able dict form of ``TurnRecord`` and ``TurnTree`` (pickling needs none of this;
it is for logs, fixtures and non-Python consumers)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from farm.trajectory.drift import DriftStats
from farm.trajectory.records import Budget, BudgetStop, FinishReason, TurnFlag, TurnRecord, as_ids, as_logprobs


def record_to_dict(rec: TurnRecord) -> dict[str, Any]:
    return {
        "turn_id": rec.turn_id,
        "session_id": rec.session_id,
        "parent_id": rec.parent_id,
        "prompt_delta_ids": rec.prompt_delta_ids.tolist(),
        "prompt_length": rec.prompt_length,
        "prompt_offset": rec.prompt_offset,
        "output_ids": rec.output_ids.tolist(),
        "output_logprobs": rec.output_logprobs.tolist(),
        "finish_reason": rec.finish_reason.value,
        "messages": list(rec.messages),
        "response": rec.response,
        "tools_digest": rec.tools_digest,
        "trainable": rec.trainable,
        "flags": sorted(f.value for f in rec.flags),
        "policy_version": rec.policy_version,
        "timings": dict(rec.timings),
        "mask_spans": [list(s) for s in rec.mask_spans],
        "created_at": rec.created_at,
        "meta": dict(rec.meta),
        "routed_experts": None if rec.routed_experts is None else {
            "start": rec.routed_start, "shape": list(rec.routed_experts.shape),
            "dtype": str(rec.routed_experts.dtype), "ids": rec.routed_experts.ravel().tolist()},
    }


def record_from_dict(d: Mapping[str, Any]) -> TurnRecord:
    return TurnRecord(
        turn_id=d["turn_id"],
        session_id=d["session_id"],
        parent_id=d.get("parent_id"),
        prompt_delta_ids=as_ids(d["prompt_delta_ids"]),
        prompt_length=int(d["prompt_length"]),
        prompt_offset=d.get("prompt_offset"),
        output_ids=as_ids(d["output_ids"]),
        output_logprobs=as_logprobs(d.get("output_logprobs", ())),
        finish_reason=FinishReason(d["finish_reason"]),
        messages=tuple(d.get("messages", ())),
        response=d.get("response"),
        tools_digest=d.get("tools_digest", ""),
        trainable=bool(d.get("trainable", True)),
        flags=frozenset(TurnFlag(f) for f in d.get("flags", ())),
        policy_version=d.get("policy_version"),
        timings=dict(d.get("timings", {})),
        mask_spans=tuple(tuple(s) for s in d.get("mask_spans", ())),
        created_at=float(d.get("created_at", 0.0)),
        meta=dict(d.get("meta", {})),
        **_routed_from_dict(d.get("routed_experts")),
    )


def _routed_from_dict(d: Mapping[str, Any] | None) -> dict[str, Any]:
    if not d:
        return {}
    ids = np.asarray(d["ids"], dtype=d.get("dtype", "uint16")).reshape(d["shape"])
    return {"routed_experts": ids, "routed_start": int(d.get("start", 0))}


def tree_to_dict(tree: Any) -> dict[str, Any]:  # a TurnTree (tree.py imports this module)
    return {
        "session_id": tree.session_id,
        "max_realign_tokens": tree.max_realign_tokens,
        "drift": tree.drift.model_dump(),
        "turns": [record_to_dict(t) for t in tree.turns],
        "budget_stop": tree.budget_stop.as_dict() if tree.budget_stop is not None else None,
    }


def tree_from_dict(cls: Any, data: Mapping[str, Any]) -> Any:  # cls: TurnTree; returns one
    return cls._restore(
        data["session_id"],
        int(data.get("max_realign_tokens", 256)),
        DriftStats.model_validate(data.get("drift", {})),
        (record_from_dict(t) for t in data["turns"]),
        budget_stop_from_dict(data.get("budget_stop")),
    )


def budget_stop_from_dict(d: Mapping[str, Any] | None) -> BudgetStop | None:
    if not d:
        return None
    return BudgetStop(budget=Budget(d["budget"]), limit=int(d["limit"]), turns=int(d["turns"]))
