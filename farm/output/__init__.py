"""farm.output: the output directory a run writes and trainers read. Crash-safe Arrow
shards with a manifest per table (``shards``, ``manifest``, ``recovery``, ``integrity``),
their readers (``shard_reader``; ``reader`` opens the Sample table from the run's
``OutputConfig``), the offline check (``verify``), token fidelity (``fidelity``) and the
PyTorch view (``torch_data``); the one writer of a run's tables (``writer``: Samples,
rollouts, transcripts, committed together), the rollouts row and the summary read back
from it (``rows``), the directory's own rules (``outdir``: ``run_config.yaml``, one task
set per directory), per-rollout artifacts (``artifacts``) and trainer-facing groups
(``groups``). Nothing here imports ``farm.rollout``: the writer takes a finished rollout
through a protocol (``writer.FinishedRollout``)."""

from farm.output.config import ArtifactsConfig, OutputConfig
from farm.output.groups import Group, GroupReader, complete_groups
from farm.output.manifest import ManifestEntry
from farm.output.reader import OutputReader, open_sample_reader, open_sample_writer
from farm.output.shard_reader import ShardReader, committed_files
from farm.output.shards import RecoveryReport, ShardWriter
from farm.output.writer import OutputWriter

__all__ = [
    "ArtifactsConfig",
    "Group",
    "GroupReader",
    "OutputWriter",
    "complete_groups",
    "ManifestEntry",
    "OutputConfig",
    "OutputReader",
    "RecoveryReport",
    "ShardReader",
    "ShardWriter",
    "committed_files",
    "open_sample_reader",
    "open_sample_writer",
]
