"""Crash-safe shard writer, generic over the table (Samples, rollouts, ...).

Layout of an output directory (several tables may share it)::

    out/manifest.jsonl                 manifest of the "samples" table
    out/samples/samples-000000-1f2e3d4c.arrow
    out/rollouts.manifest.jsonl        manifest of another table (name="rollouts")
    out/rollouts/rollouts-000000-....arrow

Each table's shards live in their own subdirectory so ``pyarrow.dataset.dataset(
out / "samples", format="ipc")`` reads exactly one schema (temporary files start with
a dot, which pyarrow ignores).

Durability: rows are buffered per rollout; a shard is *sealed* when the buffer
reaches ``max_rows`` / ``max_bytes``, on ``flush()``, or after every rollout with
``flush_every_rollout``. Sealing = write ``.name.tmp`` (the Arrow or Parquet writer's pieces
straight to the file, checksummed (xxh3_128) in a thread beside), fsync, rename, fsync the
directory, append the manifest line, fsync the manifest. A
rollout is durable only once its shard's manifest line is; ``take_durable()`` /
``flush()`` return the ids that became durable, which is what a reducer may
acknowledge. A rollout is never split across shards. Writing a rollout that is
durable or pending is a no-op returning False.

Recovery on open (after a crash, or damage): :mod:`farm.output.recovery`. It never
deletes data: temporary files are removed, a torn last manifest line is cut off, lines
whose shard is missing or damaged are dropped (their rollouts are no longer durable, so
they get rewritten; a damaged file goes to ``quarantine/``), and complete shards no line
names (sealed just before a crash) are checked and adopted. ``retract`` takes rollouts
out of a table the same way (rewritten shard, old file quarantined). One writer per
table and directory at a time (an ``flock``ed lock file); the kernel drops the lock
when a writer dies.
"""

from __future__ import annotations

import fcntl
import os
import time
import uuid
from pathlib import Path
from typing import Any, Collection, Literal, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from farm.errors import ShardError
from farm.output.checkpoint import load_checkpoint, make_checkpoint, write_checkpoint
from farm.output.durable import DurableIds
from farm.output.integrity import StreamChecksum, checksum, quarantine, read_shard_file
from farm.output.manifest import ManifestEntry, default_manifest_name, fsync_dir, read_manifest, rewrite_manifest
from farm.output.recovery import RecoveryReport, append_line, recover_table

__all__ = ["RecoveryReport", "ShardWriter", "checksum", "write_shard_bytes"]

ShardFormat = Literal["arrow", "parquet"]
SUFFIX = {"arrow": ".arrow", "parquet": ".parquet"}
Rows = pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]]


def write_shard_bytes(table: pa.Table, fmt: ShardFormat, compression: str | None, sink: pa.NativeFile) -> None:
    """Write the shard file of ``table`` into ``sink``: Arrow IPC with one record batch a
    chunk of ``table`` (a shard's table is combined to one), or Parquet."""
    if fmt == "arrow":
        with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
            w.write_table(table)
    elif table.num_rows == 0:
        # A shard of rollouts without Samples. pq.write_table would write one empty row
        # group, which HF datasets' Parquet loader cannot read (its batch size is the
        # first row group's row count: 0); a file with no row group at all is read by
        # every reader as zero rows with the full schema.
        pq.ParquetWriter(sink, table.schema, compression=compression or "none").close()
    else:
        pq.write_table(table, sink, compression=compression or "none")


class _ShardFile:
    """The temporary shard file as the Arrow and Parquet writers write it (through
    ``pa.PythonFile``): the pieces go to the file and to the checksum as they come, so a
    shard's bytes are never put together in memory (a large piece is the table's own
    buffer: the kernel's copy into the page cache is its only one). Small pieces (headers,
    padding, a short table's buffers) are gathered into one write (``finish`` writes the
    last of them)."""

    GATHER_BELOW = 64 << 10

    def __init__(self, fd: int, digest: StreamChecksum) -> None:
        self.fd, self.digest, self.size, self.closed = fd, digest, 0, False
        self._small = bytearray()

    def write(self, data: bytes | pa.Buffer) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n < self.GATHER_BELOW:
            self._small += view
            if len(self._small) >= self.GATHER_BELOW:
                self.finish()
        else:
            self.finish()
            self._write(view)
        self.size += n
        return n

    def finish(self) -> None:
        """Write the small pieces gathered so far."""
        if self._small:
            piece, self._small = memoryview(bytes(self._small)), bytearray()  # hashed as is, maybe in a thread
            self._write(piece)

    def _write(self, view: memoryview) -> None:
        self.digest.update(view)
        while view:
            view = view[os.write(self.fd, view) :]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def slices(table: pa.Table, counts: Sequence[int]) -> list[pa.Table]:
    """``table`` cut into consecutive slices of ``counts`` rows (zero-copy)."""
    out, at = [], 0
    for n in counts:
        out.append(table.slice(at, n))
        at += n
    return out


class ShardWriter:
    """Writes one table's rows as sealed shards + manifest lines. Not thread-safe."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        schema: pa.Schema,
        *,
        name: str = "samples",
        format: ShardFormat = "arrow",
        max_rows: int = 512,
        max_bytes: int = 256 << 20,
        flush_every_rollout: bool = False,
        compression: str | None = None,
        manifest_name: str | None = None,
        verify_on_open: bool = True,
        rebuild_manifest: bool = False,
        checkpoints: bool = True,
    ) -> None:
        if format not in SUFFIX:
            raise ShardError(f"unknown shard format {format!r}")
        self.directory = Path(directory)
        self.schema, self.name, self.format = schema, name, format
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self.flush_every_rollout, self.compression = flush_every_rollout, compression
        self.manifest_path = self.directory / (manifest_name or default_manifest_name(name))
        self.table_dir = self.directory / name
        self.table_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise ShardError(f"another writer holds table {name!r} in {self.directory}") from None
        # (rollout ids, their rows in order): one entry a write_rollout, or one for a whole
        # write_rollouts that fits (its table as it came: not cut per rollout and put back)
        self._buffer: list[tuple[list[str], pa.Table]] = []
        self._buffered_ids: set[str] = set()  # the ids in ``_buffer`` (a write asks per rollout)
        self._buffer_rows = self._buffer_bytes = 0
        self._newly_durable: list[str] = []
        self._closed = False
        # ``checkpoints``: open from the manifest's checkpoint (read only the lines after
        # it) and keep one (``checkpoint()``); never when rebuilding a damaged manifest
        self.checkpoints = checkpoints and not rebuild_manifest
        loaded = load_checkpoint(self.manifest_path, name) if self.checkpoints else None
        cp = loaded[0] if loaded else None
        # membership of the durable ids: digests for those a checkpoint lists (farm.output.durable)
        self._durable = DurableIds(self.manifest_path, name)
        if loaded:
            self._durable.cover(loaded[1], cp.offset)
        try:
            entries, self.recovery = recover_table(self.directory, name, schema, self.manifest_path, SUFFIX,
                                                   verify=verify_on_open, rebuild=rebuild_manifest,
                                                   checkpoint=cp, covered=self._durable)  # fmt: skip
        except BaseException:
            os.close(self._lock_fd)
            raise
        covered = cp if self.recovery.from_checkpoint else None
        if covered is None:
            self._durable.cover([], 0)
        self._durable.add(rid for e in entries for rid in e.rollout_ids)
        self.checkpoint_counts = covered.counts if covered else None  # what the rows it covers add up to
        self._next_segment = covered.next_segment if covered else 0
        # the lines since the last checkpoint (all of them without one): the earlier ones
        # are not kept in memory (``entries`` reads them back)
        self._entries = entries
        self._covered = covered is not None  # a checkpoint covers the lines before ``_entries``
        self._shards = len(entries) + (covered.shards if covered else 0)
        self._rows = sum(e.rows for e in entries) + (covered.rows if covered else 0)
        self._bytes = sum(e.bytes for e in entries) + (covered.bytes if covered else 0)
        self._next_seq = max([e.seq + 1 for e in entries] + [covered.next_seq if covered else 0])

    # ---- writing -------------------------------------------------------------
    def is_durable(self, rollout_id: str) -> bool:
        return rollout_id in self._durable

    @property
    def durable_count(self) -> int:
        return len(self._durable)

    @property
    def durable_ids(self) -> set[str]:
        """Every durable id: a fresh set (the caller's to change; at a million ids, a
        frozenset copy on top of it cost ~0.2 s)."""
        return self._durable.ids()

    @property
    def pending_ids(self) -> list[str]:
        return [rid for ids, _ in self._buffer for rid in ids]

    @property
    def entries(self) -> list[ManifestEntry]:
        """Every sealed shard of this table, in manifest order (read back from the
        manifest when a checkpoint covers the earlier ones)."""
        if not self._covered:
            return list(self._entries)
        return [e for e in read_manifest(self.manifest_path).entries if e.table == self.name]

    @property
    def entries_since_checkpoint(self) -> list[ManifestEntry]:
        """The shards sealed after the checkpoint (all of them without one)."""
        return list(self._entries)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def checkpointed(self) -> bool:
        """A checkpoint covers every shard before ``entries_since_checkpoint``."""
        return self._covered

    @property
    def from_checkpoint(self) -> bool:
        """Opened from a checkpoint that matched the manifest, with nothing after it to repair."""
        return self.recovery.from_checkpoint

    @property
    def totals(self) -> dict[str, int]:
        return {"shards": self._shards, "rows": self._rows, "bytes": self._bytes}

    def checkpoint(self, counts: dict[str, Any] | None = None) -> None:
        """Write the table's checkpoint (:mod:`farm.output.checkpoint`) covering every sealed
        shard, with what their rows add up to (``counts``, :mod:`farm.output.tally`): the
        next open reads only the lines after it, and the entries it covers are no longer
        kept in memory."""
        self._check_open()
        if not self.checkpoints:
            return
        end = os.stat(self.manifest_path).st_size if self.manifest_path.exists() else 0
        self._next_segment, segments = self._durable.seal(end, self._next_segment)
        write_checkpoint(self.manifest_path, make_checkpoint(
            self.manifest_path, self.name, end=end, shards=self._shards, rows=self._rows, nbytes=self._bytes,
            next_seq=self._next_seq, segments=[s.ref for s in segments], next_segment=self._next_segment,
            counts=counts))  # fmt: skip
        self._durable.cover(segments, end)
        self.checkpoint_counts = counts
        self._entries = []
        self._covered = True

    def write_rollout(self, rollout_id: str, rows: Rows) -> bool:
        """Buffer one rollout's rows (possibly none). False if durable or pending already.

        Durable only once sealed: see ``take_durable()`` / ``flush()``.
        """
        self._check_open()
        if rollout_id in self._buffered_ids or rollout_id in self._durable:
            return False
        table = self._as_table(rows)
        nbytes = table.nbytes
        if self._buffer and (
            self._buffer_rows + table.num_rows > self.max_rows or self._buffer_bytes + nbytes > self.max_bytes
        ):
            self._seal()
        self._buffer.append(([rollout_id], table))
        self._buffered_ids.add(rollout_id)
        self._buffer_rows += table.num_rows
        self._buffer_bytes += nbytes
        if self.flush_every_rollout or self._buffer_rows >= self.max_rows or self._buffer_bytes >= self.max_bytes:
            self._seal()
        return True

    def write_rollouts(self, rollouts: Sequence[tuple[str, int]], rows: pa.Table) -> bool:
        """Buffer several rollouts' rows at once: ``rows`` holds them in order, ``rollouts``
        gives each one's id and row count. The same as ``write_rollout`` for each of them
        (True if any was new), with one size check for all when they fit in the current
        shard: sizing each slice of a table is what a reducer's commit spent most of its
        time on."""
        self._check_open()
        table = self._as_table(rows)
        ids = [rid for rid, _ in rollouts]
        fits = (len(set(ids)) == len(ids) and not self._buffered_ids.intersection(ids)
                and not any(rid in self._durable for rid in ids) and not self.flush_every_rollout
                and self._buffer_rows + table.num_rows < self.max_rows
                and self._buffer_bytes + table.nbytes < self.max_bytes)  # fmt: skip
        if not fits:  # one by one: duplicates left out, shards sealed where the limits fall
            fresh = False
            for (rid, _), part in zip(rollouts, slices(table, [n for _, n in rollouts])):
                fresh |= self.write_rollout(rid, part)
            return fresh
        self._buffer.append((ids, table))
        self._buffered_ids.update(ids)
        self._buffer_rows += table.num_rows
        self._buffer_bytes += table.nbytes
        return bool(ids)

    def take_durable(self) -> list[str]:
        """Rollout ids that became durable since the last call (in write order)."""
        out, self._newly_durable = self._newly_durable, []
        return out

    def flush(self) -> list[str]:
        """Seal the buffered rollouts (if any); return every id newly durable."""
        self._check_open()
        if self._buffer:
            self._seal()
        return self.take_durable()

    def close(self) -> list[str]:
        """Flush and release the table lock. Idempotent."""
        if self._closed:
            return []
        try:
            return self.flush()
        finally:
            self._closed = True
            os.close(self._lock_fd)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ShardError(f"shard writer for {self.name!r} is closed")

    def _as_table(self, rows: Rows) -> pa.Table:
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        if not isinstance(rows, pa.Table):
            return pa.Table.from_pylist(list(rows), schema=self.schema)
        if not rows.schema.equals(self.schema, check_metadata=False):
            try:
                return rows.select(self.schema.names).cast(self.schema)
            except (KeyError, ValueError, pa.ArrowInvalid) as exc:
                raise ShardError(f"rows do not match the {self.name!r} schema: {exc}") from exc
        return rows

    def _seal(self) -> None:
        ids = self.pending_ids
        # one record batch a shard: the same bytes whether a rollout's rows came as a table
        # of their own or in one built for many (``OutputWriter.commit``); a buffer of one
        # table of one chunk a column is combined without a copy
        table = pa.concat_tables([t for _, t in self._buffer]).combine_chunks()
        entry = self._write_shard(table, ids)
        append_line(self.manifest_path, entry)
        self._entries.append(entry)
        self._shards += 1
        self._rows += entry.rows
        self._bytes += entry.bytes
        self._durable.add(ids)
        self._newly_durable.extend(ids)
        self._buffer.clear()
        self._buffered_ids.clear()
        self._buffer_rows = self._buffer_bytes = 0

    def _write_shard(self, table: pa.Table, ids: list[str]) -> ManifestEntry:
        """Write one shard file (temp name, fsync, rename, fsync dir) and return its
        manifest line, not yet appended. The bytes go to the file as the writer makes
        them, hashed beside the write and the fsync (``StreamChecksum``)."""
        table = table.replace_schema_metadata(self.schema.metadata)
        seq = self._next_seq
        fname = f"{self.name}-{seq:06d}-{uuid.uuid4().hex[:8]}{SUFFIX[self.format]}"
        tmp = self.table_dir / f".{fname}.tmp"
        final = self.table_dir / fname
        digest = StreamChecksum()
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                sink = _ShardFile(fd, digest)
                write_shard_bytes(table, self.format, self.compression, pa.PythonFile(sink, mode="w"))
                sink.finish()
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            digest.close()
        os.rename(tmp, final)
        fsync_dir(self.table_dir)
        self._next_seq = seq + 1
        return ManifestEntry(
            shard=f"{self.name}/{fname}", table=self.name, format=self.format, rows=table.num_rows,
            bytes=sink.size, checksum=digest.hexdigest(), rollout_ids=ids, seq=seq, created_at=time.time(),
        )  # fmt: skip

    # ---- retracting ------------------------------------------------------------
    def retract(self, rollout_ids: Collection[str]) -> list[str]:
        """Take durable rollouts out of this table (they count as not written, so they
        run again). Each shard holding one is rewritten without them under a new name,
        the manifest swaps the two lines in one atomic replace, and the old file goes to
        ``quarantine/``: nothing is deleted, and a crash at any step leaves a state the
        next recovery resolves (a new file nobody lists holds committed rollouts:
        quarantined; an old file nobody lists: likewise). Returns the quarantined paths."""
        self._check_open()
        gone = {rid for rid in set(rollout_ids) if rid in self._durable}
        moved: list[str] = []
        if gone and self._covered:  # the whole list from here on (the rewrite below reads it anyway)
            self._entries, self._covered = self.entries, False
        for e in [e for e in self._entries if gone.intersection(e.rollout_ids)]:
            keep = [rid for rid in e.rollout_ids if rid not in gone]
            replacement = None
            if keep:
                table = read_shard_file(self.directory / e.shard, e.format)
                mask = pc.invert(pc.is_in(table.column("rollout_id"), value_set=pa.array(sorted(gone))))
                replacement = self._write_shard(table.filter(mask), keep)
            lines = [x for x in read_manifest(self.manifest_path).entries if x.shard != e.shard]
            rewrite_manifest(self.manifest_path, lines + ([replacement] if replacement else []))
            moved.append(str(quarantine(self.directory, self.directory / e.shard, self.name)))
            self._entries = [x for x in self._entries if x.shard != e.shard] + ([replacement] if replacement else [])
            self._durable.discard(set(e.rollout_ids) - set(keep))
        self._shards = len(self._entries)
        self._rows = sum(e.rows for e in self._entries)
        self._bytes = sum(e.bytes for e in self._entries)
        return moved
