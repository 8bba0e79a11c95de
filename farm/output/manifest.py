"""The append-only shard manifest: one JSON line per sealed shard.

A line is appended (and fsynced) only after its shard file was written under a
temporary name, fsynced, renamed into place and its directory fsynced, so a
manifest line never names a missing or partial shard. Readers only consume
complete lines (ending in a newline); a writer that crashed mid-line leaves a
truncated last line that the next writer cuts off (``repair``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.errors import ShardError


class ManifestEntry(BaseModel):
    """One sealed shard. ``shard`` is relative to the output directory."""

    model_config = ConfigDict(extra="allow", frozen=True)

    shard: str
    table: str
    format: Literal["arrow", "parquet"]
    rows: int = Field(ge=0)
    bytes: int = Field(ge=0)
    checksum: str = Field(description="'sha256:<hex>' of the shard file")
    rollout_ids: list[str]
    seq: int = Field(ge=0, description="shard sequence number within its table")
    created_at: float = 0.0


def default_manifest_name(table: str) -> str:
    """``manifest.jsonl`` for Samples, ``<table>.manifest.jsonl`` for other tables."""
    return "manifest.jsonl" if table == "samples" else f"{table}.manifest.jsonl"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file at ``path`` and fsync it (not its directory)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ManifestRead:
    entries: list[ManifestEntry]
    end: int  # byte offset after the last complete line
    truncated_tail: bool  # bytes after ``end`` (a line cut by a crash)


def parse_lines(data: bytes, *, path: Path, base: int = 0) -> ManifestRead:
    """Parse complete lines of ``data`` (manifest bytes starting at offset ``base``)."""
    entries: list[ManifestEntry] = []
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        line = data[pos:nl].strip()
        if line:
            try:
                entries.append(ManifestEntry.model_validate(json.loads(line)))
            except (ValueError, ValidationError) as exc:
                raise ShardError(f"{path}: corrupt manifest line at byte {base + pos}: {exc}") from exc
        pos = nl + 1
    return ManifestRead(entries, base + pos, truncated_tail=pos < len(data))


def read_manifest(path: Path, offset: int = 0) -> ManifestRead:
    """Complete entries from byte ``offset`` on (missing file: none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return ManifestRead([], offset, False)
    return parse_lines(data, path=path, base=offset)


def encode(entry: ManifestEntry) -> bytes:
    return (json.dumps(entry.model_dump(), sort_keys=True, separators=(",", ":")) + "\n").encode()


def rewrite_manifest(path: Path, entries: list[ManifestEntry]) -> None:
    """Atomically replace the manifest (used only by recovery to drop bad lines)."""
    tmp = path.with_name(f".{path.name}.rewrite.tmp")
    tmp.unlink(missing_ok=True)
    write_durable(tmp, b"".join(encode(e) for e in entries))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def repair_tail(path: Path, end: int) -> None:
    """Cut a truncated last line (left by a crash mid-append) off the manifest."""
    with open(path, "r+b") as fh:
        fh.truncate(end)
        fh.flush()
        os.fsync(fh.fileno())
