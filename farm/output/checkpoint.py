"""A table's manifest checkpoint: what the first ``offset`` bytes of its manifest hold,
so that opening the table (a resume, ``farm verify --repair`` aside) reads only the
manifest lines written after it instead of every line of a run of a million rollouts,
and the run's end and ``farm inspect`` count the rows it covers without reading them.

``.<manifest name>.checkpoint`` beside the manifest (e.g. ``.rollouts.manifest.jsonl.checkpoint``)
is one JSON document and a last line with its own checksum. It holds the byte offset of
the manifest it covers (the end of a complete line), the hash of the last covered line
and where it starts, the table's facts up to there (shards, rows, bytes, the next shard
sequence number), the segments holding the durable rollout ids of the covered lines
(:mod:`farm.output.segments`: names, sizes, checksums) and what the covered rows add up
to (``counts``, :mod:`farm.output.tally`).

The manifest stays the source of truth; its format is unchanged (a directory without
checkpoints opens the way it always did). A checkpoint is written only by the table's
writer (holding its lock), after the lines it covers are durable and its segments are
written, atomically: a temporary file, fsync, rename, fsync of the directory. It is used
only when it matches the manifest: the file is at least ``offset`` bytes long and the
bytes just before ``offset`` are the covered last line (its hash, preceded by a newline
or the start of the file), and, to open a writer, when every segment it lists is there
with its checksum. A recovery that rewrites the manifest (a line dropped, a rollout
retracted) moves or changes that line, so the checkpoint no longer matches; a manifest
cut short ends before ``offset``. A missing, stale, corrupt or mismatching checkpoint is
ignored (a log line says why) and the whole manifest is read: never trusted over the
manifest.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash

from farm.output.manifest import fsync_dir, write_durable
from farm.output.segments import Segment, SegmentRef, load_segment, prune

log = logging.getLogger(__name__)

CHECKPOINT_VERSION = 3  # 2: with the digests; 3: the ids in segment files, the counts
_CHUNK = 1 << 16


def checkpoint_path(manifest_path: Path) -> Path:
    return manifest_path.with_name(f".{manifest_path.name}.checkpoint")


def _line_hash(line: bytes) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(line)


@dataclass(frozen=True)
class Checkpoint:
    """What the manifest's first ``offset`` bytes hold (see the module doc)."""

    table: str
    offset: int  # bytes of the manifest covered: the end of a complete line
    last_line_start: int  # where the last covered line starts
    last_line_hash: str  # xxh3_128 of that line (with its newline); "" when offset is 0
    shards: int  # this table's shards listed in them
    rows: int
    bytes: int
    next_seq: int  # the next shard sequence number after them
    segments: tuple[SegmentRef, ...]  # the durable rollout ids listed in them (farm.output.segments)
    next_segment: int  # the next segment file number
    counts: dict[str, Any] | None = None  # what their rows add up to (farm.output.tally), None: not kept


def last_line(path: Path, end: int) -> tuple[int, bytes]:
    """(start, bytes) of the complete line that ends at byte ``end`` of ``path``
    (``end`` is just after its newline), read backwards in chunks: not the whole file."""
    if end == 0:
        return 0, b""
    with open(path, "rb") as fh:
        tail = b""
        pos = end - 1  # the newline that ends the line
        while True:
            start = max(0, pos - _CHUNK)
            fh.seek(start)
            tail = fh.read(pos - start) + tail
            nl = tail.rfind(b"\n")
            if nl >= 0:
                begin = end - 1 - len(tail) + nl + 1
                break
            if start == 0:
                begin = 0
                break
            pos = start
        fh.seek(begin)
        return begin, fh.read(end - begin)


def make_checkpoint(manifest_path: Path, table: str, *, end: int, shards: int, rows: int, nbytes: int,
                    next_seq: int, segments: list[SegmentRef], next_segment: int,
                    counts: dict[str, Any] | None) -> Checkpoint:  # fmt: skip
    start, line = last_line(manifest_path, end)
    return Checkpoint(table=table, offset=end, last_line_start=start,
                      last_line_hash=_line_hash(line) if line else "", shards=shards, rows=rows, bytes=nbytes,
                      next_seq=next_seq, segments=tuple(segments), next_segment=next_segment,
                      counts=counts)  # fmt: skip


def write_checkpoint(manifest_path: Path, cp: Checkpoint) -> None:
    """Atomically replace the table's checkpoint (its segment files made durable first: the
    directory fsynced; then temp file, fsync, rename, fsync dir), then remove the segment
    files it no longer lists."""
    fsync_dir(manifest_path.parent)
    body = json.dumps({"version": CHECKPOINT_VERSION, **asdict(cp)}, separators=(",", ":")).encode()
    path = checkpoint_path(manifest_path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # left by a crash mid-write: never read
    write_durable(tmp, body + b"\n" + _line_hash(body).encode() + b"\n")
    os.replace(tmp, path)
    fsync_dir(path.parent)
    prune(manifest_path, cp.segments)


def read_checkpoint(manifest_path: Path, table: str) -> Checkpoint | None:
    """The table's checkpoint if there is one and it matches the manifest, else None (a
    log line says why one that exists is not used). Its segments are not read."""
    path = checkpoint_path(manifest_path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    cp, why = _parse(data, table)
    if cp is not None:
        why = _mismatch(manifest_path, cp)
    if why is not None:
        log.warning("%s: checkpoint not used (%s): reading the whole manifest", path, why)
        return None
    return cp


def load_checkpoint(manifest_path: Path, table: str) -> tuple[Checkpoint, list[Segment]] | None:
    """The table's checkpoint and its segments, each checked (``read_checkpoint``, then every
    segment there with its checksum), else None with a log line saying why."""
    cp = read_checkpoint(manifest_path, table)
    if cp is None:
        return None
    segments = []
    for ref in cp.segments:
        seg, why = load_segment(manifest_path, ref)
        if seg is None:
            log.warning("%s: checkpoint not used (%s): reading the whole manifest", checkpoint_path(manifest_path), why)
            return None
        segments.append(seg)
    return cp, segments


def _parse(data: bytes, table: str) -> tuple[Checkpoint | None, str | None]:
    body, sep, trailer = data.rstrip(b"\n").rpartition(b"\n")
    if not sep or trailer.decode(errors="replace") != _line_hash(body):
        return None, "corrupt: its checksum does not match"
    try:
        raw = json.loads(body)
        if raw.pop("version", None) != CHECKPOINT_VERSION:
            return None, "written by another version"
        raw["segments"] = tuple(SegmentRef(**r) for r in raw["segments"])
        cp = Checkpoint(**raw)
    except (ValueError, TypeError, KeyError) as exc:
        return None, f"corrupt: {exc}"
    if cp.table != table:
        return None, f"it is table {cp.table!r}'s"
    return cp, None


def _mismatch(manifest_path: Path, cp: Checkpoint) -> str | None:
    try:
        size = os.stat(manifest_path).st_size
    except FileNotFoundError:
        return None if cp.offset == 0 else "the manifest is missing"
    if size < cp.offset:
        return f"the manifest has {size} bytes, the checkpoint covers {cp.offset}"
    if cp.offset == 0:
        return None
    with open(manifest_path, "rb") as fh:
        before = cp.last_line_start - 1 if cp.last_line_start else cp.last_line_start
        fh.seek(before)
        got = fh.read(cp.offset - before)
    if cp.last_line_start and got[:1] != b"\n":
        return "the manifest was rewritten (no line starts where the covered last line did)"
    line = got[1:] if cp.last_line_start else got
    if _line_hash(line) != cp.last_line_hash:
        return "the manifest was rewritten (its line at the covered offset differs)"
    return None


def remove_checkpoint(manifest_path: Path) -> None:
    checkpoint_path(manifest_path).unlink(missing_ok=True)
    prune(manifest_path, ())
