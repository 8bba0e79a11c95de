"""Recovery of one table of an output directory when its writer opens (after a crash,
a kill, or damage from outside). It never deletes what farm wrote:

- farm's own temporary files (``.<shard>.tmp``) are removed: they were never sealed;
- a manifest line cut by a crash (the last one) is cut off;
- a line whose shard is missing is dropped and its rollouts reported lost (they are no
  longer durable, so they run again); a line whose shard has the wrong size or fails
  its checksum (``verify``) is dropped and the shard moved to ``quarantine/``;
- a complete shard that no line names (sealed just before a crash, or listed by a line
  that was lost) is checked (:func:`farm.output.integrity.inspect_orphan`: it
  opens, validates, matches the schema, and none of its rollouts is committed in
  another shard) and **adopted**: its manifest line is written again. One that fails
  the check is quarantined;
- a manifest with a corrupt line in the middle (never a crash: damage) is an error,
  unless ``rebuild``: then it is quarantined and rebuilt from the shard files.

The :class:`RecoveryReport` says what was done; ``line()`` is the one-line form that
``farm run`` prints when a resume changed anything.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Container
from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel, Field

from farm.errors import ShardError
from farm.output.checkpoint import Checkpoint
from farm.output.integrity import inspect_orphan, quarantine, verify_bytes
from farm.output.manifest import ManifestEntry, encode, fsync_dir, read_manifest, repair_tail, rewrite_manifest

log = logging.getLogger(__name__)
_SEQ = re.compile(r"-(\d{6,})-[0-9a-f]+\.")


class RecoveryReport(BaseModel):
    """What opening a writer found and fixed."""

    temp_files_removed: int = 0
    truncated_manifest_tail: bool = False
    entries_dropped: int = 0  # manifest lines whose shard was missing, the wrong size or damaged
    missing_shards: list[str] = Field(default_factory=list)
    quarantined: list[str] = Field(default_factory=list, description="shard files moved to quarantine/")
    adopted: list[str] = Field(default_factory=list, description="complete shards given their manifest line back")
    lost_rollouts: list[str] = Field(default_factory=list, description="no longer durable: they run again")
    manifest_rebuilt: bool = False
    from_checkpoint: bool = Field(default=False, description="only the manifest lines after its checkpoint were read")

    @property
    def changed(self) -> bool:
        return bool(self.temp_files_removed or self.truncated_manifest_tail or self.entries_dropped
                    or self.quarantined or self.adopted or self.manifest_rebuilt)  # fmt: skip

    def line(self, table: str) -> str:
        parts = []
        if self.adopted:
            parts.append(f"adopted {len(self.adopted)} unlisted shard(s)")
        if self.missing_shards:
            parts.append(f"{len(self.missing_shards)} shard(s) missing")
        if self.quarantined:
            parts.append(f"quarantined {len(self.quarantined)} ({', '.join(self.quarantined[:3])})")
        if self.lost_rollouts:
            parts.append(f"{len(self.lost_rollouts)} rollout(s) to run again")
        if self.truncated_manifest_tail:
            parts.append("cut a torn manifest line")
        if self.temp_files_removed:
            parts.append(f"removed {self.temp_files_removed} temp file(s)")
        if self.manifest_rebuilt:
            parts.append("rebuilt the manifest from the shards")
        return f"recovery of {table}: " + ("; ".join(parts) or "nothing to do")


def recover_table(directory: Path, name: str, schema: pa.Schema, manifest_path: Path, fmt_suffix: dict[str, str],
                  *, verify: bool = True, rebuild: bool = False,
                  checkpoint: Checkpoint | None = None,
                  covered: Container[str] = ()) -> tuple[list[ManifestEntry], RecoveryReport]:
    """Bring one table's manifest and shard files back to agreement; see the module doc.

    With a ``checkpoint`` (one that matched the manifest; ``covered``: the ids its lines
    list), only the lines after it are read and checked, and returned: the shards it
    covers were sealed and fsynced before it was written (``farm verify`` checks them).
    Should a line after it need dropping (the manifest is then rewritten), the whole
    manifest is read and checked instead."""
    rep = RecoveryReport()
    table_dir = directory / name
    names = os.listdir(table_dir)  # one listing (names, not paths: a table may hold 10^5 shards)
    for n in names:
        if n.startswith(".") and n.endswith(".tmp"):
            (table_dir / n).unlink()
            rep.temp_files_removed += 1
    if checkpoint is not None:
        names = [n for n in names if not n.startswith(".")]
        return _recover_tail(directory, name, schema, manifest_path, fmt_suffix, verify, checkpoint, rep, names,
                             covered)  # fmt: skip
    try:
        read = read_manifest(manifest_path)
    except ShardError as exc:
        if not rebuild:
            raise ShardError(f"{exc} (damage, not a crash: run `farm verify --repair {directory}`)") from None
        rep.quarantined.append(str(quarantine(directory, manifest_path, name).relative_to(directory)))
        rep.manifest_rebuilt = True
        read = read_manifest(manifest_path)  # gone: start empty, adopt every shard below
    if read.truncated_tail:
        repair_tail(manifest_path, read.end)
        rep.truncated_manifest_tail = True
    good: list[ManifestEntry] = []
    for e in read.entries:
        if e.table != name:
            good.append(e)
            continue
        problem = _problem(directory, e, verify)
        if problem is None:
            good.append(e)
            continue
        rep.entries_dropped += 1
        rep.lost_rollouts.extend(e.rollout_ids)
        path = directory / e.shard
        if path.is_file():
            rep.quarantined.append(str(quarantine(directory, path, name).relative_to(directory)))
        else:
            rep.missing_shards.append(e.shard)
    if rep.entries_dropped:
        rewrite_manifest(manifest_path, good)
    _adopt_orphans(directory, name, schema, manifest_path, fmt_suffix, good, rep)
    mine = [e for e in good if e.table == name]
    durable = {rid for e in mine for rid in e.rollout_ids}
    rep.lost_rollouts = sorted(set(rep.lost_rollouts) - durable)
    return mine, rep


def _recover_tail(directory: Path, name: str, schema: pa.Schema, manifest_path: Path, fmt_suffix: dict[str, str],
                  verify: bool, cp: Checkpoint, rep: RecoveryReport, names: list[str],
                  covered: Container[str]) -> tuple[list[ManifestEntry], RecoveryReport]:  # fmt: skip
    try:
        read = read_manifest(manifest_path, cp.offset)
    except ShardError:
        read = None
    # The shards the checkpoint covers are not read (nor checksummed: ``farm verify`` does
    # that), but they must all be there: as many files numbered below ``next_seq`` as it
    # lists (a lost one, or one put there from outside, changes the count).
    suffixes = set(fmt_suffix.values())
    shards = [n for n in names if n.startswith(f"{name}-") and os.path.splitext(n)[1] in suffixes]
    on_disk = sum(1 for n in shards if _seq_of(n) < cp.next_seq)
    if read is None:
        why: str | None = "a corrupt line after it"
    elif on_disk != cp.shards:
        why = f"{on_disk} shard files before it, it lists {cp.shards}"
    elif any(_problem(directory, e, verify) is not None for e in read.entries if e.table == name):
        why = "a line after it to repair"
    else:
        why = None
    if why is not None:
        log.warning("%s: checkpoint not used (%s): recovering from the whole manifest", manifest_path, why)
        rest, full = recover_table(directory, name, schema, manifest_path, fmt_suffix, verify=verify)
        full.temp_files_removed += rep.temp_files_removed
        return rest, full
    if read.truncated_tail:
        repair_tail(manifest_path, read.end)
        rep.truncated_manifest_tail = True
    rep.from_checkpoint = True
    tail = list(read.entries)
    # a shard sealed after the checkpoint whose line a crash lost has a sequence number
    # from ``next_seq`` on; the ones before are listed by the lines the checkpoint covers
    late = [n for n in shards if _seq_of(n) >= cp.next_seq]
    _adopt_orphans(directory, name, schema, manifest_path, fmt_suffix, tail, rep,
                   covered=covered, candidates=late)  # fmt: skip
    return [e for e in tail if e.table == name], rep


def _problem(directory: Path, e: ManifestEntry, verify: bool) -> str | None:
    path = directory / e.shard
    if not path.is_file():
        return "missing"
    if path.stat().st_size != e.bytes:
        return "wrong size"
    if verify:
        try:
            with pa.memory_map(str(path), "r") as src:
                verify_bytes(e.shard, e.checksum, src.read_buffer())
        except ShardError as exc:
            return str(exc)
    return None


def _seq_of(name: str) -> int:
    m = _SEQ.search(name)
    return int(m.group(1)) if m else 0


def _adopt_orphans(directory: Path, name: str, schema: pa.Schema, manifest_path: Path, fmt_suffix: dict[str, str],
                   good: list[ManifestEntry], rep: RecoveryReport, *, covered: Container[str] = (),
                   candidates: list[str] | None = None) -> None:  # fmt: skip
    """``candidates``: the file names that may be unlisted (default: every file of the table);
    ``covered``: ids committed by lines a checkpoint covers (not in ``good``)."""
    table_dir = directory / name
    known = {directory / e.shard for e in good}
    committed = {rid for e in good if e.table == name for rid in e.rollout_ids}
    formats = {suffix: fmt for fmt, suffix in fmt_suffix.items()}
    files = table_dir.iterdir() if candidates is None else (table_dir / n for n in candidates)
    orphans = sorted(p for p in files if p.name.startswith(f"{name}-") and p.suffix in formats and p not in known)
    for p in orphans:
        fmt = formats[p.suffix]
        try:
            found = inspect_orphan(p, fmt, schema)
            if committed.intersection(found.rollout_ids) or any(rid in covered for rid in found.rollout_ids):
                raise ShardError(f"{p}: holds rollouts another shard already commits")
        except ShardError:
            rep.quarantined.append(str(quarantine(directory, p, name).relative_to(directory)))
            continue
        entry = ManifestEntry(
            shard=f"{name}/{p.name}", table=name, format=fmt, rows=found.rows, bytes=found.bytes,  # type: ignore[arg-type]
            checksum=found.checksum, rollout_ids=found.rollout_ids, seq=_seq_of(p.name),
            created_at=p.stat().st_mtime, adopted=True,
        )  # fmt: skip
        append_line(manifest_path, entry)
        good.append(entry)
        committed.update(found.rollout_ids)
        rep.adopted.append(entry.shard)


def append_line(manifest_path: Path, entry: ManifestEntry) -> None:
    """Append one manifest line and fsync it (and the directory when the file is new)."""
    created = not manifest_path.exists()
    fd = os.open(manifest_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, encode(entry))
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        fsync_dir(manifest_path.parent)
