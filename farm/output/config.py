"""The output directory's config sections: where and how Samples are written
(``output:``), and what each rollout keeps beside them (``artifacts:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dir: str = Field(default="runs/local", description="output directory (shards + manifest.jsonl)")
    format: Literal["arrow", "parquet"] = Field(default="arrow", description="shard format")
    shard_max_rows: int = Field(default=512, gt=0, description="rotate a shard after this many Samples")
    shard_max_bytes: int = Field(default=256 << 20, gt=0, description="rotate a shard after this many bytes")
    reward_policy: Literal["split", "each"] = Field(
        default="each",
        description="'each': every Sample of a rollout gets its reward; 'split': reward/K over its K Samples",
    )
    flush_every_rollout: bool = Field(
        default=False,
        description="seal a shard after every rollout (each rollout durable at once; many small shards)",
    )
    keep_untrained_chains: bool = Field(
        default=False, description="also emit Samples whose loss_mask is all 0 (side requests, error branches)"
    )
    mixed_tasks: Literal["refuse", "allow"] = Field(
        default="refuse",
        description="a run (farm run, farm rollout, farm serve, farm.Farm) whose tasks.path differs from the one "
        "whose rollouts the directory already holds: 'refuse' = fail before anything starts (rollout ids are "
        "<task id>.<i>: a resume would skip the other set's ids, groups would mix); 'allow' = warn and add to it",
    )
    compression: Literal["lz4", "zstd"] | None = Field(
        default=None, description="shard compression (Arrow IPC buffers / Parquet pages); none by default"
    )


class ArtifactsConfig(BaseModel):
    """What each rollout keeps under ``<output dir>/artifacts/``."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(default=True, description="write per-rollout artifacts")
    max_bytes_per_rollout: int = Field(
        default=32 << 20, ge=4096,
        description="uncompressed bytes kept per rollout over all its files; a file over its share keeps its "
        "head and tail, and index.json records what was cut",
    )  # fmt: skip
