"""Reading an output directory: :class:`OutputReader` opens each of its tables the one
way (only what a manifest commits, checksums verified unless asked not to, older shards
brought to the current columns) and its run files; :func:`open_sample_reader` /
:func:`open_sample_writer` open the Sample table from the run's ``OutputConfig``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml

from farm.output.config import OutputConfig
from farm.output.shard_reader import ShardReader
from farm.trajectory.schema import SAMPLE_SCHEMA
from farm.output.shards import ShardWriter
from farm.output.rows import ROLLOUT_SCHEMA, TRANSCRIPT_SCHEMA, migrate_rollouts

# the tables of an output directory, and the run files beside them
SAMPLES_TABLE, ROLLOUTS_TABLE, TRANSCRIPTS_TABLE = "samples", "rollouts", "transcripts"
RUN_CONFIG, SUMMARY, INVOCATIONS = "run_config.yaml", "summary.json", "invocations.jsonl"


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


class OutputReader:
    """An output directory, read: its tables (each a :class:`ShardReader`), the resolved
    config of the run that wrote it and its last summary. ``verify``: checksum every shard
    read; ``on_damaged="skip"`` leaves damaged shards out (each reader's ``skipped``)."""

    def __init__(self, directory: str | os.PathLike[str], *, verify: bool = True,
                 on_damaged: Literal["raise", "skip"] = "raise") -> None:  # fmt: skip
        self.directory = Path(directory)
        self.verify, self.on_damaged = verify, on_damaged

    def samples(self) -> ShardReader:
        return open_sample_reader(self.directory, verify=self.verify, on_damaged=self.on_damaged)

    def rollouts(self) -> ShardReader:
        """The rollouts table, rows written before a column existed with it as null."""
        return ShardReader(self.directory, name=ROLLOUTS_TABLE, schema=ROLLOUT_SCHEMA, verify=self.verify,
                           on_damaged=self.on_damaged, migrate=migrate_rollouts)  # fmt: skip

    def transcripts(self) -> ShardReader:
        return ShardReader(self.directory, name=TRANSCRIPTS_TABLE, schema=TRANSCRIPT_SCHEMA, verify=self.verify,
                           on_damaged=self.on_damaged)  # fmt: skip

    def table(self, name: str) -> ShardReader:
        """The table called ``name`` (``samples``, ``rollouts``, ``transcripts``)."""
        tables = {SAMPLES_TABLE: self.samples, ROLLOUTS_TABLE: self.rollouts, TRANSCRIPTS_TABLE: self.transcripts}
        if name not in tables:
            raise ValueError(f"no table {name!r} in an output directory (one of {', '.join(tables)})")
        return tables[name]()

    def rollout_rows(self, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rollouts table's rows (only ``columns``, when given); [] before the first."""
        reader = self.rollouts()
        if not reader.entries():
            return []
        table = reader.read_table()
        return (table.select(columns) if columns is not None else table).to_pylist()

    def run_config(self) -> dict[str, Any]:
        """``run_config.yaml``: the config of the run that last wrote here ({} if none)."""
        path = self.directory / RUN_CONFIG
        return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}

    def summary(self) -> dict[str, Any] | None:
        """``summary.json``: the last invocation's summary (None if none)."""
        path = self.directory / SUMMARY
        return json.loads(path.read_text()) if path.is_file() else None

    def invocations(self) -> list[dict[str, Any]]:
        """``invocations.jsonl``: one line per command that wrote here (a line cut short by
        a crash mid-write is left out)."""
        path = self.directory / INVOCATIONS
        if not path.is_file():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return [ln for ln in out if isinstance(ln, dict)]
