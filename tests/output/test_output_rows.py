"""The rollouts row is declared once (farm.output.rows.RolloutRow) and its Arrow schema
derived from it: the derived schema is byte for byte the one farm has always written
(names, order, types, nullability, field docs), so every table on disk still reads."""

from __future__ import annotations

import json

import pyarrow as pa

from farm.output.rows import (
    ROLLOUT_SCHEMA,
    SUMMARY_COLUMNS,
    TRANSCRIPT_SCHEMA,
    RolloutRow,
    row_to_summary,
    transcript_table,
)
from farm.output.rows import RolloutSummary
from farm.trajectory.row_schema import Arrow, arrow_schema

# The rollouts schema as written by hand before it was derived from RolloutRow: what shards already
# on disk hold, so never edit a line here; a new column is added at the end of both.
GOLDEN = pa.schema(
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
)  # fmt: skip

# The transcripts schema as written before it was derived (farm/trajectory/transcript.py).
GOLDEN_TRANSCRIPTS = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("rollout_id", pa.string()),
        pa.field("task_id", pa.string()),
        pa.field("turn_index", pa.int32()),
        pa.field("endpoint", pa.string(), metadata={"doc": "the endpoints catalog name"}),
        pa.field("model", pa.string(), metadata={"doc": "the model the endpoint reported (or was asked for)"}),
        pa.field("protocol", pa.string(), metadata={"doc": "the CLI's wire protocol"}),
        pa.field("side_request", pa.bool_()),
        pa.field("extends_turn", pa.int32(),
                 metadata={"doc": "the turn whose request messages this request starts with (null: none)"}),
        pa.field("messages", pa.large_string(),
                 metadata={"doc": "canonical request messages after those of extends_turn (all if null), JSON"}),
        pa.field("tools", pa.large_string(), metadata={"doc": "canonical tool names, JSON list"}),
        pa.field("response", pa.large_string(), metadata={"doc": "the canonical assistant message, JSON"}),
        pa.field("finish_reason", pa.string()),
        pa.field("flags", pa.string(), metadata={"doc": "turn flags, JSON list"}),
        pa.field("prompt_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("cached_tokens", pa.int64()),
        pa.field("latency_ms", pa.float64()),
        pa.field("attempts", pa.int32(), metadata={"doc": "HTTP requests it took (retries of 429 / 5xx / timeouts)"}),
        pa.field("output_ids", pa.list_(pa.int32()),
                 metadata={"doc": "re-tokenized from the endpoint's logprob tokens (flag retokenized), else null"}),
        pa.field("output_logprobs", pa.list_(pa.float32()),
                 metadata={"doc": "the endpoint's logprob per output token, when it returned them, else null"}),
    ]
)  # fmt: skip


def test_the_derived_rollouts_schema_is_the_one_on_disk():
    assert ROLLOUT_SCHEMA.equals(GOLDEN, check_metadata=True)
    assert [f.metadata for f in ROLLOUT_SCHEMA] == [f.metadata for f in GOLDEN]
    assert ROLLOUT_SCHEMA.serialize().to_pybytes() == GOLDEN.serialize().to_pybytes()


def test_the_derived_transcripts_schema_is_the_one_on_disk():
    assert TRANSCRIPT_SCHEMA.equals(GOLDEN_TRANSCRIPTS, check_metadata=True)
    assert TRANSCRIPT_SCHEMA.serialize().to_pybytes() == GOLDEN_TRANSCRIPTS.serialize().to_pybytes()


def test_a_transcript_row_not_declared_is_refused():
    import pytest
    from pydantic import ValidationError

    row = {"run_id": "r", "rollout_id": "r.0", "task_id": "t", "turn_index": 0, "endpoint": "e", "model": "m",
           "protocol": "anthropic", "side_request": False, "messages": "[]", "tools": "[]", "response": "{}",
           "finish_reason": "stop", "flags": "[]", "prompt_tokens": 1, "output_tokens": 2, "cached_tokens": 0,
           "latency_ms": 1.5, "attempts": 1}  # fmt: skip
    assert transcript_table([row]).schema.equals(TRANSCRIPT_SCHEMA, check_metadata=True)
    with pytest.raises(ValidationError, match="surprise"):
        transcript_table([{**row, "surprise": 1}])


def test_arrow_schema_maps_python_types_and_annotations():
    from typing import Annotated

    from pydantic import BaseModel

    from typing import Any

    class Row(BaseModel):
        a: str
        b: int | None = None
        c: Annotated[int, Arrow(pa.int32(), "small")] = 0
        d: float = 0.0
        e: bool = False
        f: Annotated[Any, Arrow(pa.large_binary(), nullable=True)] = None

    assert arrow_schema(Row).equals(pa.schema([
        pa.field("a", pa.string()), pa.field("b", pa.int64()), pa.field("c", pa.int32(), metadata={"doc": "small"}),
        pa.field("d", pa.float64()), pa.field("e", pa.bool_()), pa.field("f", pa.large_binary()),
    ]), check_metadata=True)  # fmt: skip
    # strict: nulls only where the field takes None (or its Arrow annotation says so), and the table's metadata
    assert arrow_schema(Row, strict_nulls=True, metadata={b"k": b"v"}).equals(pa.schema([
        pa.field("a", pa.string(), nullable=False), pa.field("b", pa.int64()),
        pa.field("c", pa.int32(), nullable=False, metadata={"doc": "small"}),
        pa.field("d", pa.float64(), nullable=False), pa.field("e", pa.bool_(), nullable=False),
        pa.field("f", pa.large_binary()),
    ], metadata={b"k": b"v"}), check_metadata=True)  # fmt: skip


def test_a_row_rebuilt_from_samples_is_complete_and_says_so():
    meta = {"attempt": 2, "reason": "tests pass", "rollout_reward": 1.0, "grading": {"resolved": True},
            "rollout_turns": 3}  # fmt: skip
    sample = {"run_id": "run", "rollout_id": "t.1", "group_id": "g", "task_id": "t", "sample_index": 1,
              "harness": "claude-code", "model": "m", "reward": 0.5, "status": "completed", "num_turns": 3,
              "metadata": json.dumps(meta)}  # fmt: skip
    row = RolloutRow.rebuilt("t.1", [sample, sample])
    assert (row.run_id, row.group_id, row.task_id, row.sample_index, row.attempt, row.status) == (
        "run", "g", "t", 1, 2, "completed")
    assert row.reason == "tests pass [row rebuilt from Samples after a reducer crash]"
    assert (row.reward, row.turns, row.num_samples, row.mode) == (1.0, 3, 2, "token_exact")
    assert json.loads(row.grading) == {"resolved": True}
    table = pa.Table.from_pylist([row.model_dump()], schema=ROLLOUT_SCHEMA)  # every column, the schema's types
    assert table.column_names == ROLLOUT_SCHEMA.names
    lost = RolloutRow.rebuilt("u.0", [])  # no Samples at all: an infrastructure failure, not a policy outcome
    assert lost.status == "sandbox_error" and lost.num_samples == 0


def test_a_summary_is_read_back_from_the_row():
    assert SUMMARY_COLUMNS == [k for k in RolloutSummary.model_fields if k in RolloutRow.model_fields]
    row = RolloutRow(rollout_id="t.0", group_id="g", task_id="t", status="completed", reward=1.0, turns=4)
    summary = row_to_summary({**row.model_dump(), "node": None})  # a table written before `node`
    assert summary == RolloutSummary(rollout_id="t.0", group_id="g", task_id="t", status="completed", reward=1.0,
                                     turns=4)  # fmt: skip
