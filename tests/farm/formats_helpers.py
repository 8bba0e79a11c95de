"""Output directories written through farm's real writer path (OutputWriter: linearized
Samples + rollout rows, committed in batches) and a reader-agnostic row check, shared by
the format tests (Parquet readers, ``farm export``, schema versions). No Ray."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from farm.rollout.model import RolloutResult
from farm.output.writer import OutputWriter
from farm.output.rows import counts_of
from farm.status import RolloutStatus
from farm.output.config import OutputConfig
from farm.trajectory.linearize import RolloutInfo, linearize
from farm.trajectory.schema import SAMPLE_SCHEMA, Sample, samples_to_table
from farm.trajectory.tree import TurnTree

# three commits: a shard of four Samples (one rollout has a retry branch), one whose
# second rollout is an infrastructure failure (a row, no Sample), and one of a failure
# only: a samples shard with zero rows
BATCHES = (("t0.0", "t0.1"), ("t1.0", "t1.1"), ("t2.0",))
FAILED = {"t1.1", "t2.0"}
LIST_TYPES = {"tokens": pa.list_(pa.int32()), "loss_mask": pa.list_(pa.uint8()),
              "rollout_logprobs": pa.list_(pa.float32())}  # fmt: skip
LIST_DTYPES = {"tokens": np.int32, "loss_mask": np.uint8, "rollout_logprobs": np.float32}


def make_tree(rid: str, *, turns: int = 3, policy_version: int = 4, branch: bool = False) -> TurnTree:
    """Token ids beyond int16, distinct float32 logprobs, one weight version per turn."""
    tree = TurnTree(f"session-{rid}")
    parent = first = None
    for k in range(turns):
        out = [70_000 + 11 * k + j for j in range(3)]
        rec = tree.append(parent_id=parent, prompt_delta_ids=[151_644, 3 + k, 4 + k] if parent is None else [7, 8],
                          output_ids=out, output_logprobs=[-0.125 * (j + 1) - k / 1024 for j in range(3)],
                          finish_reason="stop" if k < turns - 1 else "length",
                          policy_version=policy_version + k)  # fmt: skip
        parent, first = rec.turn_id, first or rec.turn_id
    if branch:  # a retry of the second turn: a second chain
        tree.append(parent_id=first, prompt_delta_ids=[7, 9], output_ids=[90_001, 90_002],
                    output_logprobs=[-2.5, -0.03125], finish_reason="stop",
                    policy_version=policy_version + 9)  # fmt: skip
    return tree


def make_result(rid: str, group_index: int, *, failed: bool = False, **tree_kw: Any) -> RolloutResult:
    task, index = rid.rsplit(".", 1)
    tree = None if failed else make_tree(rid, **tree_kw)
    return RolloutResult(
        run_id="fmt-run", rollout_id=rid, group_id=task, task_id=task, sample_index=int(index),
        group_index=group_index, harness="claude_code", model="policy-π", attempt=1,
        status=RolloutStatus.SETUP_FAILED if failed else RolloutStatus.COMPLETED,
        reason="pip install failed" if failed else "", reward=0.0 if failed else 0.75,
        grading=None if failed else {"resolved": False, "passed": ["t::a"], "note": "naïve ✓"},
        diff="" if failed else "diff --git a/x.py b/x.py\n+é\n", agent_log_tail='{"type":"result"}',
        counts=counts_of(tree), timings={"agent": 1.5, "total": 2.25}, sandbox_id=f"sb-{rid}",
        actor="farm-fmt-sandbox-0", policy_version_at_finish=12, started_at=100.0, finished_at=103.5, tree=tree,
    )  # fmt: skip


def samples_of(result: RolloutResult) -> list[Sample]:
    """What the reducer linearizes for a rollout (nothing for an infrastructure failure)."""
    if result.tree is None:
        return []
    info = RolloutInfo(
        rollout_id=result.rollout_id, run_id=result.run_id, task_id=result.task_id, group_id=result.group_id,
        sample_index=result.sample_index, group_index=result.group_index, harness=result.harness,
        model=result.model, status=result.status.value, reward=result.reward,
        metadata={"reason": result.reason, "attempt": result.attempt, "grading": result.grading,
                  "unicode": "ünïcödé ✓ 🚀", "nested": {"a": [1, 2.5, None]}},
    )  # fmt: skip
    return linearize(result.tree, info)


def write_run(out: Path, fmt: str, batches: Iterable[Iterable[str]] = BATCHES, *, group_base: int = 0,
              **tree_kw: Any) -> tuple[list[Sample], list[dict[str, Any]]]:
    """Commit ``batches`` of rollouts to ``out`` through a OutputWriter (one commit per
    batch, so one shard per table per batch); return the Samples and rollout rows written."""
    store = OutputWriter(out, OutputConfig(dir=str(out), format=fmt))
    samples: list[Sample] = []
    rows: list[dict[str, Any]] = []
    try:
        for b, batch in enumerate(batches):
            for rid in batch:
                result = make_result(rid, group_base + b, failed=rid in FAILED, branch=rid.endswith(".0"), **tree_kw)
                mine = samples_of(result)
                store.add(result, mine)
                samples += mine
                rows.append(result.row(num_samples=len(mine)).model_dump())
            store.commit(store.take_buffer())
    finally:
        store.close()
    return samples, rows


def v1_table(samples: list[Sample]) -> pa.Table:
    """A version-1 Samples table (``policy_version`` where v2 has group_index and
    policy_version_min/max; schema metadata version 1), as the previous farm wrote it."""
    v1 = v1_schema()
    table = samples_to_table(samples)
    old = table.column("policy_version_min")
    table = table.drop_columns(["group_index", "policy_version_min", "policy_version_max"])
    return table.append_column("policy_version", old).select(v1.names).cast(v1)


def v1_schema() -> pa.Schema:
    fields = [pa.field("policy_version", pa.int64()) if f.name == "group_index" else f for f in SAMPLE_SCHEMA
              if f.name not in ("policy_version_min", "policy_version_max")]  # fmt: skip
    return pa.schema(fields, metadata={b"farm.table": b"samples", b"farm.schema_version": b"1"})


def key(row: Mapping[str, Any]) -> tuple[str, int]:
    return row["rollout_id"], int(row["chain_index"])


def assert_rows_are_samples(rows: list[Mapping[str, Any]], expected: list[Sample]) -> None:
    """``rows`` (dicts from any reader: lists or numpy arrays for the list columns, the
    metadata as a JSON string) hold exactly ``expected``: row for row, token for token."""
    want = {(s.rollout_id, s.chain_index): s for s in expected}
    assert len(rows) == len(expected) and {key(r) for r in rows} == set(want)
    for row in rows:
        s = want[key(row)]
        for name in LIST_DTYPES:
            got = np.asarray(row[name])
            assert got.tolist() == getattr(s, name).tolist(), (key(row), name)
        for f in SAMPLE_SCHEMA:
            if f.name not in LIST_DTYPES and f.name != "metadata":
                assert row[f.name] == getattr(s, f.name), (key(row), f.name, row[f.name])
        assert json.loads(row["metadata"]) == s.metadata


def assert_rows_are_rollouts(rows: list[Mapping[str, Any]], expected: list[dict[str, Any]]) -> None:
    want = {r["rollout_id"]: r for r in expected}
    assert len(rows) == len(expected) and {r["rollout_id"] for r in rows} == set(want)
    for row in rows:
        assert dict(row) == want[row["rollout_id"]], row["rollout_id"]
