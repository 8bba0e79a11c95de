"""Reading shards for trainers: everything at once, batch by batch, or following the
manifest while a run is still writing.

Only shards named by a complete manifest line are read, so a reader never sees a
partial shard. Arrow IPC shards are memory-mapped (zero-copy). Every shard is checked
against its manifest checksum by default (xxh3_128: a few percent of a read, see
``scripts/bench_trajectory.py``): a damaged one raises ``ShardError`` naming the shard
and both checksums, or with ``on_damaged="skip"`` is left out and recorded in
``reader.skipped``. ``follow_batches`` never yields a rollout twice, even when a
recovery adopted a shard again or a rollout was run again after its shard was lost. The shard files are
plain Arrow IPC / Parquet: ``pyarrow.dataset.dataset(out / "samples", format="ipc")``
reads them too (it does not consult the manifest: point it at a directory whose
writer is done, or use ``follow``). ``committed_files`` gives the exact file list to
hand to readers that take paths (HF datasets, polars, DuckDB, Ray Data).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from farm.errors import ShardError
from farm.output.manifest import ManifestEntry, default_manifest_name, read_manifest
from farm.output.integrity import verify_bytes
from farm.trajectory.schema import migrate_table

Stop = threading.Event | Callable[[], bool]


def polling(*, poll_interval: float, stop: Stop | None, timeout: float | None) -> Iterator[None]:
    """One iteration per look at a run in progress, ``poll_interval`` apart. Ends when
    ``stop`` is set / returns True (after a last look) or after ``timeout`` seconds; at
    least one of them is required."""
    if stop is None and timeout is None:
        raise ValueError("follow() needs a stop condition or a timeout")
    is_set = stop.is_set if isinstance(stop, threading.Event) else (stop or (lambda: False))
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        stopping = is_set()
        yield
        if stopping or (deadline is not None and time.monotonic() >= deadline):
            return
        wait = poll_interval if deadline is None else max(0.0, min(poll_interval, deadline - time.monotonic()))
        if isinstance(stop, threading.Event):
            stop.wait(wait)
        else:
            time.sleep(wait)


class ManifestTail:
    """The lines a manifest gained since the last look, read from where the last look
    ended (not the whole file each time). Robust to the manifest being rewritten by a
    recovering writer: it is read again from the start, shards deduplicated by name."""

    def __init__(self, path: Path, table: str) -> None:
        self.path, self.table = path, table
        self._seen: set[str] = set()
        self._offset, self._inode = 0, None

    @property
    def offset(self) -> int:
        """Bytes of the manifest read so far (the end of the last complete line)."""
        return self._offset

    def seek(self, offset: int) -> None:
        """Read from byte ``offset`` on (the end of a line a reader already read up to):
        the lines before it are not read. A manifest rewritten since (another inode, or
        shorter) is read again from the start, as always."""
        self._offset = offset
        try:
            self._inode = os.stat(self.path).st_ino
        except FileNotFoundError:
            self._inode = None

    def new_entries(self) -> list[ManifestEntry]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._inode is not None and (st.st_ino != self._inode or st.st_size < self._offset):
            self._offset = 0
        self._inode = st.st_ino
        read = read_manifest(self.path, self._offset)
        self._offset = read.end
        out = []
        for e in read.entries:
            if e.table == self.table and e.shard not in self._seen:
                self._seen.add(e.shard)
                out.append(e)
        return out


class ShardReader:
    """Reads one table (``name``) of an output directory through its manifest."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        name: str = "samples",
        schema: pa.Schema | None = None,
        manifest_name: str | None = None,
        verify: bool = True,
        on_damaged: Literal["raise", "skip"] = "raise",
        migrate: Callable[[pa.Table], pa.Table] | None = None,
    ) -> None:
        if on_damaged not in ("raise", "skip"):
            raise ValueError(f"on_damaged must be 'raise' or 'skip', not {on_damaged!r}")
        self.directory = Path(directory)
        self.name, self.schema, self.verify, self.on_damaged = name, schema, verify, on_damaged
        if migrate is None and name == "samples":
            migrate = migrate_table
        # shards written by an older schema version come out in the current shape
        self.migrate = migrate
        self.skipped: list[tuple[ManifestEntry, str]] = []  # (shard, why) left out with on_damaged="skip"
        # shards this reader already verified, by file identity: a second read (another
        # epoch, follow then read_table) is not hashed again unless the file changed
        self._verified: dict[str, tuple[int, int, int]] = {}
        self.manifest_path = self.directory / (manifest_name or default_manifest_name(name))

    def entries(self) -> list[ManifestEntry]:
        """Sealed shards of this table, in manifest order."""
        seen: set[str] = set()
        out = []
        for e in read_manifest(self.manifest_path).entries:
            if e.table == self.name and e.shard not in seen:
                seen.add(e.shard)
                out.append(e)
        return out

    def rollout_ids(self) -> set[str]:
        return {rid for e in self.entries() for rid in e.rollout_ids}

    def files(self) -> list[Path]:
        """The committed shard files, in manifest order, each checked against its
        checksum unless ``verify=False`` (a missing or damaged one raises, or with
        ``on_damaged="skip"`` is left out and recorded). A later ``read_shard`` of an
        unchanged file does not hash it again."""
        out = []
        for e in self.entries():
            path = self.directory / e.shard
            try:
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    raise ShardError(f"{path}: named by {self.manifest_path.name} but missing") from None
                identity = (st.st_ino, st.st_size, st.st_mtime_ns)
                if self.verify and self._verified.get(e.shard) != identity:
                    with pa.memory_map(str(path), "r") as src:
                        verify_bytes(e.shard, e.checksum, src.read_buffer())
                    self._verified[e.shard] = identity
            except ShardError as exc:
                if self.on_damaged == "raise":
                    raise
                self.skipped.append((e, str(exc)))
                continue
            out.append(path)
        return out

    def read_shard(self, entry: ManifestEntry) -> pa.Table:
        """One shard's rows (checked against the manifest unless ``verify=False``)."""
        path = self.directory / entry.shard
        try:
            st = os.stat(path)
            identity = (st.st_ino, st.st_size, st.st_mtime_ns)
            check = self.verify and self._verified.get(entry.shard) != identity
            if entry.format == "arrow":
                with pa.memory_map(str(path), "r") as src:
                    if check:
                        verify_bytes(entry.shard, entry.checksum, src.read_buffer())
                        src.seek(0)
                    table = pa.ipc.open_file(src).read_all()
            else:
                if check:
                    verify_bytes(entry.shard, entry.checksum, pa.py_buffer(path.read_bytes()))
                table = pq.read_table(path)
            if check:
                self._verified[entry.shard] = identity
            return self.migrate(table) if self.migrate is not None else table
        except FileNotFoundError:
            raise ShardError(f"{path}: named by {self.manifest_path.name} but missing") from None
        except pa.ArrowInvalid as exc:
            raise ShardError(f"{path}: unreadable shard: {exc}") from exc

    def _read_or_skip(self, entry: ManifestEntry) -> pa.Table | None:
        try:
            return self.read_shard(entry)
        except ShardError as exc:
            if self.on_damaged == "raise":
                raise
            self.skipped.append((entry, str(exc)))
            return None

    def read_table(self) -> pa.Table:
        """Every row of every sealed shard as one table."""
        tables = [t for t in (self._read_or_skip(e) for e in self.entries()) if t is not None]
        if not tables:
            if self.schema is None:
                raise ShardError(f"{self.manifest_path}: no shards yet and no schema given")
            return self.schema.empty_table()
        return pa.concat_tables(tables, promote_options="default")

    def iter_batches(self) -> Iterator[pa.RecordBatch]:
        for e in self.entries():
            table = self._read_or_skip(e)
            if table is not None:
                yield from table.to_batches()

    def follow(
        self,
        *,
        poll_interval: float = 0.5,
        stop: Stop | None = None,
        timeout: float | None = None,
    ) -> Iterator[ManifestEntry]:
        """Yield shards as their manifest lines land (existing ones first).

        Ends when ``stop`` is set/returns True (after a last look at the manifest) or
        after ``timeout`` seconds; at least one of them is required. Robust to the
        manifest being rewritten by a recovering writer (shards are deduplicated).
        """
        tail = ManifestTail(self.manifest_path, self.name)
        for _ in polling(poll_interval=poll_interval, stop=stop, timeout=timeout):
            yield from tail.new_entries()

    def follow_batches(self, **kwargs) -> Iterator[pa.RecordBatch]:
        """``follow`` yielding the record batches of each new shard, each rollout once:
        rows of a rollout already yielded from an earlier shard (a rollout run again
        after its shard was lost, a shard adopted again) are left out."""
        yielded: set[str] = set()
        for e in self.follow(**kwargs):
            table = self._read_or_skip(e)
            if table is None:
                continue
            if yielded.intersection(e.rollout_ids) and "rollout_id" in table.column_names:
                table = table.filter(pc.invert(pc.is_in(table.column("rollout_id"), value_set=pa.array(sorted(yielded)))))
            yielded.update(e.rollout_ids)
            yield from table.to_batches()


def committed_files(directory: str | os.PathLike[str], table: str = "samples", *, verify: bool = True) -> list[str]:
    """Paths of the shards the manifest of ``table`` commits, for readers that take file
    lists (``datasets.load_dataset("parquet", data_files=...)``, ``polars.read_parquet``,
    DuckDB's ``read_parquet``, ``ray.data.read_parquet``).

    A glob of ``<dir>/<table>/*.parquet`` is the same list only for a run whose writer
    is done and that ``farm verify`` passes: in a live or crashed run it also matches a
    shard sealed but not yet listed (which a recovery may still quarantine), and it
    never checks a checksum. ``ShardError`` if a listed shard is missing or damaged
    (``verify``), or if a rollout is listed by two shards: plain-file readers would count
    its rows twice (``farm export`` writes a copy holding each rollout once).
    """
    reader = ShardReader(directory, name=table, verify=verify)
    owner: dict[str, str] = {}
    for e in reader.entries():
        for rid in e.rollout_ids:
            if owner.setdefault(rid, e.shard) != e.shard:
                raise ShardError(f"{reader.manifest_path}: rollout {rid!r} is listed by {owner[rid]} and "
                                 f"{e.shard}; `farm export` writes a copy that holds it once")  # fmt: skip
    return [str(p) for p in reader.files()]
