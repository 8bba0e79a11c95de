"""The rollouts table: one row per rollout (ids, harness, status + reason, reward,
grading report, diff, agent log tail, counts, timings, sandbox id); the small summary
of a rollout the driver sees (``RolloutSummary``, read back from that table); and the
transcripts table's row (a black-box rollout's turns).

Written next to the Sample shards by the reducer with the same atomic shard +
manifest discipline (``rollouts-*`` shards, ``rollouts.manifest.jsonl``), so runs can
be analysed and SFT sets built without touching Sample metadata.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from farm.status import RetryDecision, RolloutStatus
from farm.trajectory.linearize import is_trainable
from farm.trajectory.records import FinishReason
from farm.trajectory.row_schema import Arrow, arrow_schema
from farm.trajectory.transcript import Transcript

Int32 = Annotated[int, Arrow(pa.int32())]
Text = Annotated[str, Arrow(pa.large_string())]


class RolloutCounts(BaseModel):
    """Token and turn counts of a session tree (the row's count columns)."""

    model_config = ConfigDict(extra="forbid")

    turns: int = 0
    trainable_turns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    engine_errors: int = 0
    policy_version_min: int | None = None  # weight versions of the trained turns
    policy_version_max: int | None = None


class RolloutRow(BaseModel):
    """One row of the rollouts table: the one declaration of its columns (their order,
    Arrow types and docs: :data:`ROLLOUT_SCHEMA` is derived from it). JSON columns are
    strings; the defaults are what a row rebuilt from its Samples says of what they do not
    carry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str = ""
    rollout_id: str
    group_id: str = ""
    task_id: str = ""
    sample_index: Int32 = 0
    group_index: Annotated[int | None, Arrow(doc="the group's position in the run's task stream")] = None
    attempt: Int32 = 1
    harness: str = ""
    model: str = ""
    status: str  # a RolloutStatus value, as farm.rollout.outcome decided it
    reason: str = ""
    reward: float = 0.0
    grading: Annotated[str, Arrow(pa.large_string(), "the grading report, JSON ('' if not graded)")] = ""
    diff: Text = ""
    agent_log_tail: Text = ""
    turns: Int32 = 0
    trainable_turns: Int32 = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    engine_errors: Int32 = 0
    num_samples: Int32 = 0
    policy_version_min: Annotated[int | None, Arrow(doc="oldest weight version of a trained turn")] = None
    policy_version_max: Annotated[int | None, Arrow(doc="newest weight version of a trained turn")] = None
    policy_version_at_finish: Annotated[
        int | None, Arrow(doc="the farm's weight version when the rollout was recorded (staleness = this - min)")
    ] = None
    timings: Annotated[str, Arrow(doc="seconds per phase, JSON")] = "{}"
    duration_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    sandbox_id: str = ""
    actor: str = ""
    sandbox_policy: Annotated[str | None, Arrow(doc="network + limits the agent sandbox ran with, JSON")] = None
    mode: Annotated[str, Arrow(doc="token_exact (the farm engine: Samples) or black_box (a hosted endpoint: the "
                                   "transcripts table, never Samples)")] = "token_exact"  # fmt: skip
    node: Annotated[str, Arrow(doc="Ray node id of the sandbox actor that ran it ('' if none)")] = ""

    @classmethod
    def rebuilt(cls, rollout_id: str, samples: list[dict[str, Any]]) -> RolloutRow:
        """The row of a rollout whose Samples are committed but whose row a crash lost, from
        those Samples' columns (``run_id`` ... ``metadata``); the rest keeps its default."""
        first = samples[0] if samples else {}
        meta = json.loads(first.get("metadata") or "{}")
        same = {k: first[k] for k in ("run_id", "group_id", "task_id", "sample_index", "harness", "model", "status")
                if first.get(k) is not None}  # fmt: skip
        same.setdefault("status", RolloutStatus.SANDBOX_ERROR.value)  # no Sample says how it ended: not the policy's
        return cls(
            rollout_id=rollout_id, **same, attempt=int(meta.get("attempt", 1)),
            reason=((meta.get("reason") or "") + " [row rebuilt from Samples after a reducer crash]").strip(),
            reward=float(meta.get("rollout_reward") or 0.0), grading=json.dumps(meta.get("grading") or {}, sort_keys=True),
            turns=int(meta.get("rollout_turns", 0)), num_samples=len(samples),
        )  # fmt: skip


ROLLOUT_SCHEMA = arrow_schema(RolloutRow)
# the JSON columns: what a result holds as objects, the row as text
JSON_COLUMNS = ("grading", "timings", "sandbox_policy")

class TranscriptRow(BaseModel):
    """One row of the transcripts table (a black-box rollout's turn, built by
    ``Transcript.rows``): :data:`TRANSCRIPT_SCHEMA` is derived from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    rollout_id: str
    task_id: str
    turn_index: Int32
    endpoint: Annotated[str, Arrow(doc="the endpoints catalog name")]
    model: Annotated[str, Arrow(doc="the model the endpoint reported (or was asked for)")]
    protocol: Annotated[str, Arrow(doc="the CLI's wire protocol")]
    side_request: bool
    extends_turn: Annotated[int | None, Arrow(pa.int32(), "the turn whose request messages this request starts "
                                                          "with (null: none)")] = None  # fmt: skip
    messages: Annotated[str, Arrow(pa.large_string(), "canonical request messages after those of extends_turn "
                                                      "(all if null), JSON")]  # fmt: skip
    tools: Annotated[str, Arrow(pa.large_string(), "canonical tool names, JSON list")]
    response: Annotated[str, Arrow(pa.large_string(), "the canonical assistant message, JSON")]
    finish_reason: str
    flags: Annotated[str, Arrow(doc="turn flags, JSON list")]
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    latency_ms: float
    attempts: Annotated[int, Arrow(pa.int32(), "HTTP requests it took (retries of 429 / 5xx / timeouts)")]
    output_ids: Annotated[list[int] | None, Arrow(pa.list_(pa.int32()), "re-tokenized from the endpoint's "
                                                  "logprob tokens (flag retokenized), else null")] = None  # fmt: skip
    output_logprobs: Annotated[list[float] | None, Arrow(pa.list_(pa.float32()), "the endpoint's logprob per "
                                                         "output token, when it returned them, else null")] = None  # fmt: skip


TRANSCRIPT_SCHEMA = arrow_schema(TranscriptRow)


def transcript_table(rows: list[dict[str, Any]]) -> pa.Table:
    """A black-box rollout's transcript rows (``Transcript.rows``), each checked against the declaration."""
    return pa.Table.from_pylist([TranscriptRow(**r).model_dump() for r in rows], schema=TRANSCRIPT_SCHEMA)


class RolloutSummary(BaseModel):
    """What travels back to the driver: small, no tokens (``RolloutResult.summary``; read
    back from a rollouts row by :func:`row_to_summary`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: str
    group_id: str
    task_id: str
    attempt: int = 1
    status: RolloutStatus
    reason: str = ""
    reward: float = 0.0
    turns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    duration_s: float = 0.0
    started_at: float = Field(default=0.0, description="epoch seconds (0: not known, e.g. never started)")
    finished_at: float = 0.0
    sandbox_id: str = ""
    actor: str = ""
    node: str = ""
    durable: bool = Field(default=True, description="the reducer acknowledged it (written, or already there)")
    retry: RetryDecision | None = Field(
        default=None, exclude=True, description="not durable: what the actor or reducer decided (run again / drop)"
    )

    def handed_back(self, decision: RetryDecision, *, status: RolloutStatus | None = None,
                    reason: str | None = None) -> RolloutSummary:
        """This attempt handed back to the dispatcher, not recorded, with the retry decision
        made where it ended (``farm.rollout.retry.decide``), which the dispatcher carries out;
        ``status`` / ``reason``: what it is reported as, when that differs from how it ended."""
        update: dict = {"durable": False, "retry": decision}
        if status is not None:
            update["status"] = status
        if reason is not None:
            update["reason"] = reason
        return self.model_copy(update=update)


# the columns a RolloutSummary (what the driver sees) is read back from
SUMMARY_COLUMNS = [k for k in RolloutSummary.model_fields if k in RolloutRow.model_fields]

def rows_to_table(rows: Sequence[RolloutRow]) -> pa.Table:
    return pa.Table.from_pylist([r.model_dump() for r in rows], schema=ROLLOUT_SCHEMA)


def migrate_rollouts(table: pa.Table) -> pa.Table:
    """A rollouts table written before a column existed, with that column as nulls
    (columns are only ever added: the Sample schema's migration rule)."""
    for f in ROLLOUT_SCHEMA:
        if f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table.select(ROLLOUT_SCHEMA.names)


def row_to_summary(row: dict[str, Any]) -> RolloutSummary:
    """The summary of a row read back (a column an older table lacks keeps its default)."""
    return RolloutSummary(**{k: row[k] for k in SUMMARY_COLUMNS if row.get(k) is not None})


def counts_of(tree: Any) -> RolloutCounts:
    """Turn and token counts of a session tree (None: no session)."""
    if tree is None:
        return RolloutCounts()
    if isinstance(tree, Transcript):  # black-box: the endpoint's usage, nothing trainable
        return RolloutCounts(
            turns=len(tree.turns), prompt_tokens=sum(t.prompt_tokens for t in tree.turns),
            output_tokens=sum(t.output_tokens for t in tree.turns), engine_errors=len(tree.errors),
        )  # fmt: skip
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
