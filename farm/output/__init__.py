"""farm.output: the output directory a run writes and trainers read. Crash-safe Arrow
shards with a manifest per table (``shards``, ``manifest``, ``recovery``, ``integrity``),
their readers (``shard_reader``; ``reader`` opens the Sample table from the run's
``OutputConfig``), the offline check (``verify``), token fidelity (``fidelity``) and the
PyTorch view (``torch_data``)."""

from farm.output.config import OutputConfig
from farm.output.manifest import ManifestEntry
from farm.output.reader import open_sample_reader, open_sample_writer
from farm.output.shard_reader import ShardReader, committed_files
from farm.output.shards import RecoveryReport, ShardWriter

__all__ = [
    "ManifestEntry",
    "OutputConfig",
    "RecoveryReport",
    "ShardReader",
    "ShardWriter",
    "committed_files",
    "open_sample_reader",
    "open_sample_writer",
]
