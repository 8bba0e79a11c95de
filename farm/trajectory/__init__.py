"""farm.trajectory: turn records, per-session turn trees, linearization into Samples,
the Sample schema, and crash-safe Arrow shards with a manifest."""

from farm.trajectory.drift import DriftKind, DriftStats
from farm.trajectory.linearize import RolloutInfo, chain_ends, is_trainable, linearize
from farm.trajectory.manifest import ManifestEntry
from farm.trajectory.output import open_sample_reader, open_sample_writer
from farm.trajectory.reader import ShardReader, committed_files
from farm.trajectory.records import FinishReason, TurnFlag, TurnRecord, as_ids, as_logprobs
from farm.trajectory.schema import (
    SAMPLE_SCHEMA,
    Sample,
    from_slime_dict,
    samples_to_table,
    table_to_samples,
    to_slime_dict,
)
from farm.trajectory.shards import RecoveryReport, ShardWriter
from farm.trajectory.tree import TurnTree

__all__ = [
    "SAMPLE_SCHEMA",
    "DriftKind",
    "DriftStats",
    "FinishReason",
    "ManifestEntry",
    "RecoveryReport",
    "RolloutInfo",
    "Sample",
    "ShardReader",
    "ShardWriter",
    "TurnFlag",
    "TurnRecord",
    "TurnTree",
    "as_ids",
    "as_logprobs",
    "chain_ends",
    "committed_files",
    "from_slime_dict",
    "is_trainable",
    "linearize",
    "open_sample_reader",
    "open_sample_writer",
    "samples_to_table",
    "table_to_samples",
    "to_slime_dict",
]
