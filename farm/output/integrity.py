"""Shard integrity: checksums, the check a shard file must pass to be adopted, quarantine.

Checksums are ``<algorithm>:<hex>`` strings in each manifest line. New shards use
``xxh3_128`` (xxhash: tens of GB/s, so verifying on every read costs little); ``sha256``
lines written by older versions are still verified with sha256.

Nothing farm wrote is ever deleted by a recovery: a shard that cannot be served
(damaged, unreadable, wrong schema, or claiming rollouts another shard holds) is moved
to ``<out>/quarantine/<table>/`` and reported; only farm's own temporary files
(``.<name>.tmp``) are removed.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from farm.errors import ShardError

DEFAULT_ALGORITHM = "xxh3_128"
QUARANTINE_DIR = "quarantine"


def checksum(data: pa.Buffer | bytes | memoryview, algorithm: str = DEFAULT_ALGORITHM) -> str:
    view = memoryview(data)
    if algorithm == "xxh3_128":
        return "xxh3_128:" + xxhash.xxh3_128_hexdigest(view)
    if algorithm == "sha256":
        return "sha256:" + hashlib.sha256(view).hexdigest()
    raise ShardError(f"unknown checksum algorithm {algorithm!r}")


class StreamChecksum:
    """The checksum of bytes handed over in pieces, in order. From the first large piece on
    it is computed in a thread of its own, so a shard's bytes are hashed while they are
    written and fsynced, not in a pass before or after (xxhash and hashlib let go of the
    GIL on large pieces); small pieces before it are hashed at once (a small shard starts
    no thread). A piece is hashed as it is when hashed: the caller keeps it unchanged
    until ``hexdigest``."""

    THREAD_FROM = 1 << 20  # bytes: a piece this large is hashed beside its writing

    def __init__(self, algorithm: str = DEFAULT_ALGORITHM) -> None:
        if algorithm == "xxh3_128":
            self._hash = xxhash.xxh3_128()
        elif algorithm == "sha256":
            self._hash = hashlib.sha256()
        else:
            raise ShardError(f"unknown checksum algorithm {algorithm!r}")
        self.algorithm = algorithm
        self._pieces: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while (piece := self._pieces.get()) is not None:
            self._hash.update(piece)

    def update(self, piece: memoryview) -> None:
        if self._thread is None:
            if piece.nbytes < self.THREAD_FROM:
                self._hash.update(piece)
                return
            self._thread = threading.Thread(target=self._run, name="shard-checksum", daemon=True)
            self._thread.start()
        self._pieces.put(piece)  # in order after the pieces before: the thread hashes them all from here

    def close(self) -> None:
        """Wait for the pieces handed over so far (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            self._pieces.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        """``<algorithm>:<hex>`` of every piece handed over (the same as ``checksum`` of them joined)."""
        self.close()
        return f"{self.algorithm}:{self._hash.hexdigest()}"


def algorithm_of(digest: str) -> str:
    return digest.split(":", 1)[0] if ":" in digest else "sha256"


def verify_bytes(shard: str, expected: str, data: pa.Buffer | bytes | memoryview) -> None:
    """Raise ``ShardError`` naming the shard and both checksums unless ``data`` matches."""
    got = checksum(data, algorithm_of(expected))
    if got != expected:
        raise ShardError(f"{shard}: damaged shard: checksum {got} != manifest {expected}")


def read_shard_file(path: Path, fmt: str) -> pa.Table:
    """The whole table of a shard file (``ShardError`` if it does not parse)."""
    try:
        if fmt == "arrow":
            with pa.memory_map(str(path), "r") as src:
                return pa.ipc.open_file(src).read_all()
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ShardError(f"{path}: unreadable shard: {exc}") from exc


@dataclass(frozen=True)
class ShardFile:
    """A shard file that passed :func:`inspect_orphan`: what its manifest line says."""

    rows: int
    bytes: int
    checksum: str
    rollout_ids: list[str]


def inspect_orphan(path: Path, fmt: str, schema: pa.Schema) -> ShardFile:
    """A complete shard no manifest line names: it must open, validate, match the
    table's schema and carry a ``rollout_id`` column. ``ShardError`` says why not."""
    table = read_shard_file(path, fmt)
    if not table.schema.equals(schema, check_metadata=False):
        raise ShardError(f"{path}: schema differs from the table's")
    try:
        table.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise ShardError(f"{path}: invalid data: {exc}") from exc
    if "rollout_id" not in table.column_names:
        raise ShardError(f"{path}: no rollout_id column")
    ids = list(dict.fromkeys(table.column("rollout_id").to_pylist()))
    data = path.read_bytes()
    return ShardFile(rows=table.num_rows, bytes=len(data), checksum=checksum(data), rollout_ids=ids)


def quarantine(directory: Path, path: Path, table: str) -> Path:
    """Move ``path`` under ``<directory>/quarantine/<table>/`` (never overwriting); return where."""
    dest_dir = directory / QUARANTINE_DIR / table
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / path.name
    n = 1
    while dest.exists():
        dest = dest_dir / f"{path.name}.{n}"
        n += 1
    os.rename(path, dest)
    return dest
