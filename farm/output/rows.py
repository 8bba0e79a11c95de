"""The rollouts table: one row per rollout (ids, harness, status + reason, reward,
grading report, diff, agent log tail, counts, timings, sandbox id).

Written next to the Sample shards by the reducer with the same atomic shard +
manifest discipline (``rollouts-*`` shards, ``rollouts.manifest.jsonl``), so runs can
be analysed and SFT sets built without touching Sample metadata.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from farm.rollout.model import RolloutCounts, RolloutResult, RolloutSummary
from farm.status import RolloutStatus

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("rollout_id", pa.string()),
        pa.field("group_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("sample_index", pa.int32()),
        pa.field("group_index", pa.int64(), metadata={"doc": "the group's position in the run's task stream"}),
        pa.field("attempt", pa.int32()),
        pa.field("harness", pa.string()),
        pa.field("model", pa.string()),
        pa.field("status", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("reward", pa.float64()),
        pa.field("grading", pa.large_string(), metadata={"doc": "the grading report, JSON ('' if not graded)"}),
        pa.field("diff", pa.large_string()),
        pa.field("agent_log_tail", pa.large_string()),
        pa.field("turns", pa.int32()),
        pa.field("trainable_turns", pa.int32()),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("engine_errors", pa.int32()),
        pa.field("num_samples", pa.int32()),
        pa.field("policy_version_min", pa.int64(), metadata={"doc": "oldest weight version of a trained turn"}),
        pa.field("policy_version_max", pa.int64(), metadata={"doc": "newest weight version of a trained turn"}),
        pa.field("policy_version_at_finish", pa.int64(),
                 metadata={"doc": "the farm's weight version when the rollout was recorded (staleness = this - min)"}),
        pa.field("timings", pa.string(), metadata={"doc": "seconds per phase, JSON"}),
        pa.field("duration_s", pa.float64()),
        pa.field("started_at", pa.float64()),
        pa.field("finished_at", pa.float64()),
        pa.field("sandbox_id", pa.string()),
        pa.field("actor", pa.string()),
        pa.field("sandbox_policy", pa.string(), metadata={"doc": "network + limits the agent sandbox ran with, JSON"}),
        pa.field("mode", pa.string(), metadata={"doc": "token_exact (the farm engine: Samples) or black_box (a hosted "
                                                       "endpoint: the transcripts table, never Samples)"}),
        pa.field("node", pa.string(), metadata={"doc": "Ray node id of the sandbox actor that ran it ('' if none)"}),
    ]
)

SUMMARY_COLUMNS = [
    "rollout_id", "group_id", "task_id", "attempt", "status", "reason", "reward", "turns",
    "prompt_tokens", "output_tokens", "duration_s", "sandbox_id", "actor", "node",
]  # fmt: skip


def result_to_row(result: RolloutResult, num_samples: int) -> dict[str, Any]:
    c = result.counts
    return {
        "run_id": result.run_id,
        "rollout_id": result.rollout_id,
        "group_id": result.group_id,
        "task_id": result.task_id,
        "sample_index": result.sample_index,
        "group_index": result.group_index,
        "attempt": result.attempt,
        "harness": result.harness,
        "model": result.model,
        "status": result.status.value,
        "reason": result.reason,
        "reward": float(result.reward),
        "grading": result.grading_json(),
        "diff": result.diff,
        "agent_log_tail": result.agent_log_tail,
        "turns": c.turns,
        "trainable_turns": c.trainable_turns,
        "prompt_tokens": c.prompt_tokens,
        "output_tokens": c.output_tokens,
        "engine_errors": c.engine_errors,
        "num_samples": num_samples,
        "policy_version_min": c.policy_version_min,
        "policy_version_max": c.policy_version_max,
        "policy_version_at_finish": result.policy_version_at_finish,
        "timings": json.dumps(result.timings, sort_keys=True),
        "duration_s": result.duration_s,
        "started_at": result.started_at,
        "finished_at": result.finished_at,
        "sandbox_id": result.sandbox_id,
        "actor": result.actor,
        "sandbox_policy": json.dumps(result.sandbox_policy, sort_keys=True),
        "mode": result.mode,
        "node": result.node,
    }


def rows_to_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=ROLLOUT_SCHEMA)


def migrate_rollouts(table: pa.Table) -> pa.Table:
    """A rollouts table written before a column existed, with that column as nulls
    (columns are only ever added: the Sample schema's migration rule)."""
    for f in ROLLOUT_SCHEMA:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(ROLLOUT_SCHEMA.names)


def row_to_summary(row: dict[str, Any]) -> RolloutSummary:
    return RolloutSummary(
        rollout_id=row["rollout_id"],
        group_id=row["group_id"],
        task_id=row["task_id"],
        attempt=row["attempt"],
        status=RolloutStatus(row["status"]),
        reason=row["reason"],
        reward=row["reward"],
        turns=row["turns"],
        prompt_tokens=row["prompt_tokens"],
        output_tokens=row["output_tokens"],
        duration_s=row["duration_s"],
        sandbox_id=row["sandbox_id"],
        actor=row["actor"],
        node=row.get("node") or "",
    )


def counts_of(tree: Any) -> RolloutCounts:
    """Turn and token counts of a session tree (None: no session)."""
    if tree is None:
        return RolloutCounts()
    from farm.trajectory.transcript import Transcript

    if isinstance(tree, Transcript):  # black-box: the endpoint's usage, nothing trainable
        return RolloutCounts(
            turns=len(tree.turns), prompt_tokens=sum(t.prompt_tokens for t in tree.turns),
            output_tokens=sum(t.output_tokens for t in tree.turns), engine_errors=len(tree.errors),
        )  # fmt: skip
    from farm.trajectory.linearize import is_trainable
    from farm.trajectory.records import FinishReason

    turns = list(tree.turns)
    versions = [t.policy_version for t in turns if t.policy_version is not None and is_trainable(t)]
    return RolloutCounts(
        policy_version_min=min(versions) if versions else None,
        policy_version_max=max(versions) if versions else None,
        turns=len(turns),
        trainable_turns=sum(1 for t in turns if is_trainable(t)),
        prompt_tokens=sum(len(t.prompt_delta_ids) for t in turns),
        output_tokens=sum(len(t.output_ids) for t in turns),
        engine_errors=sum(1 for t in turns if t.finish_reason is FinishReason.ERROR),
    )
