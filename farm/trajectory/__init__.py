"""farm.trajectory: turn records, per-session turn trees, linearization into Samples,
and the Sample schema. (The shards, manifests and readers of an output directory are
:mod:`farm.output`'s.)"""

from __future__ import annotations

from farm.trajectory.drift import DriftKind, DriftStats
from farm.trajectory.linearize import RolloutInfo, chain_ends, is_trainable, linearize
from farm.trajectory.records import FinishReason, TurnFlag, TurnRecord, as_ids, as_logprobs
from farm.trajectory.schema import (
    SAMPLE_SCHEMA,
    Sample,
    from_slime_dict,
    samples_to_table,
    table_to_samples,
    to_slime_dict,
)
from farm.trajectory.tree import TurnTree

__all__ = [
    "SAMPLE_SCHEMA",
    "DriftKind",
    "DriftStats",
    "FinishReason",
    "RolloutInfo",
    "Sample",
    "TurnFlag",
    "TurnRecord",
    "TurnTree",
    "as_ids",
    "as_logprobs",
    "chain_ends",
    "from_slime_dict",
    "is_trainable",
    "linearize",
    "samples_to_table",
    "table_to_samples",
    "to_slime_dict",
]
