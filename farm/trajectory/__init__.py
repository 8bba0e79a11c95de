"""farm.trajectory: turn records, per-session turn trees, linearization into Samples,
and the Sample schema. The shards, manifests and readers of an output directory moved
to :mod:`farm.output` (issue 29); their old names here keep working for one release."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

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
from farm.moved import install as _install_moved

_install_moved()  # farm.trajectory.{reader,output,torch_data,config} moved to farm.output

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

# name -> its module in farm.output (imported on first use: farm.output sits above this package)
_MOVED = {
    "ManifestEntry": "farm.output.manifest",
    "RecoveryReport": "farm.output.shards",
    "ShardReader": "farm.output.shard_reader",
    "ShardWriter": "farm.output.shards",
    "committed_files": "farm.output.shard_reader",
    "open_sample_reader": "farm.output.reader",
    "open_sample_writer": "farm.output.reader",
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"farm.trajectory.{name} moved to {_MOVED[name]}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_MOVED[name]), name)
