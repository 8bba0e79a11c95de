"""The Sample table of an output directory, opened from the run's ``OutputConfig``."""

from __future__ import annotations

import os

from farm.output.config import OutputConfig
from farm.output.shard_reader import ShardReader
from farm.trajectory.schema import SAMPLE_SCHEMA
from farm.output.shards import ShardWriter


def open_sample_writer(cfg: OutputConfig) -> ShardWriter:
    """The ``samples`` table writer (``manifest.jsonl``) configured by ``cfg``."""
    return ShardWriter(
        cfg.dir,
        SAMPLE_SCHEMA,
        name="samples",
        format=cfg.format,
        max_rows=cfg.shard_max_rows,
        max_bytes=cfg.shard_max_bytes,
        flush_every_rollout=cfg.flush_every_rollout,
        compression=cfg.compression,
    )


def open_sample_reader(directory: str | os.PathLike[str], *, verify: bool = True,
                       on_damaged: str = "raise") -> ShardReader:
    """The ``samples`` table reader: checksums verified by default; ``on_damaged="skip"``
    leaves damaged shards out (``reader.skipped`` lists them) instead of raising."""
    return ShardReader(directory, name="samples", schema=SAMPLE_SCHEMA, verify=verify,
                       on_damaged=on_damaged)  # type: ignore[arg-type]  # fmt: skip
