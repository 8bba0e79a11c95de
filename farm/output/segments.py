"""The durable ids a table's manifest checkpoint covers, as append-only segment files, so a
checkpoint writes only what the table gained since the one before (not every id of a run
of a million rollouts again) and an open loads 8 bytes an id, not a JSON list of strings.

A segment ``.<manifest name>.ids-<n>-<random>`` beside the manifest holds the ids some
manifest lines list:

    b"FARMIDS1", count n (uint64)       16 bytes
    n xxh3_64 digests, sorted           uint64 little-endian
    n manifest byte offsets             uint64: where the line listing that id starts
    the ids, one JSON string a line     in no particular order (a resume's done ids)

The checkpoint lists its segments with their sizes and checksums (xxh3_128 of the file).
A match on a digest is confirmed by reading the one manifest line at its offset
(:class:`farm.output.durable.DurableIds`). Segments are merged when the newest ones are
as large as the one before them (a binary counter: at most log2(ids / smallest) + 1
segments, each id rewritten at most that many times), by a streaming merge that holds one
chunk of the merged inputs at a time besides the new digests. Files are written (temp,
fsync, rename) before the checkpoint that lists them, and removed after the checkpoint
that stops listing them: a crash leaves a listed file in place, at worst an unlisted one
(removed by the next checkpoint).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xxhash

MAGIC = b"FARMIDS1"
HEADER = 16
MERGE_CHUNK = 1 << 16  # ids per step of a merge
_COPY = 1 << 20


@dataclass(frozen=True)
class SegmentRef:
    """A segment as its checkpoint lists it."""

    name: str  # the file's name, beside the manifest
    count: int  # ids in it
    checksum: str  # xxh3_128 of the file


@dataclass
class Segment:
    """A loaded segment: its digests in memory, the rest read from the file when asked."""

    ref: SegmentRef
    path: Path
    digests: np.ndarray  # sorted uint64

    def offsets(self, lo: int, hi: int) -> np.ndarray:
        """The manifest offsets of digests ``lo:hi``."""
        with open(self.path, "rb") as fh:
            fh.seek(HEADER + 8 * (self.ref.count + lo))
            return np.frombuffer(fh.read(8 * (hi - lo)), dtype="<u8")

    def all_offsets(self) -> np.ndarray:
        return np.memmap(self.path, dtype="<u8", mode="r", offset=HEADER + 8 * self.ref.count,
                         shape=(self.ref.count,)) if self.ref.count else np.empty(0, dtype="<u8")  # fmt: skip

    def ids(self) -> list[str]:
        with open(self.path, "rb") as fh:
            fh.seek(HEADER + 16 * self.ref.count)
            blob = fh.read().rstrip(b"\n")
        return json.loads(b"[" + blob.replace(b"\n", b",") + b"]") if blob else []

    def ids_blob_range(self) -> tuple[int, int]:
        return HEADER + 16 * self.ref.count, os.stat(self.path).st_size


def prefix(manifest_path: Path) -> str:
    return f".{manifest_path.name}.ids-"


def digest(rollout_id: str) -> int:
    return xxhash.xxh3_64_intdigest(rollout_id.encode())


def digests(ids: Iterable[str]) -> np.ndarray:
    return np.fromiter((digest(r) for r in ids), dtype=np.uint64)


def _new_path(manifest_path: Path, seq: int) -> Path:
    return manifest_path.with_name(f"{prefix(manifest_path)}{seq:06d}-{uuid.uuid4().hex[:8]}")


def _checksum(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        while chunk := fh.read(_COPY):
            h.update(chunk)
    return "xxh3_128:" + h.hexdigest()


def _seal(tmp: Path, final: Path, count: int) -> SegmentRef:
    with open(tmp, "r+b") as fh:
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, final)
    return SegmentRef(name=final.name, count=count, checksum=_checksum(final))


def _pwrite_all(fd: int, data: bytes | np.ndarray, at: int) -> None:
    """Write all of ``data`` (bytes, or a contiguous array as it is in memory) at ``at``."""
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def write_segment(manifest_path: Path, seq: int, ids: list[str], offsets: list[int]) -> Segment:
    """A new segment of ``ids`` (``offsets``: where the manifest line listing each starts)."""
    d = digests(ids)
    order = np.argsort(d, kind="stable")
    final = _new_path(manifest_path, seq)
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(MAGIC + np.uint64(len(ids)).astype("<u8").tobytes())
        fh.write(d[order].astype("<u8").tobytes())
        fh.write(np.asarray(offsets, dtype="<u8")[order].tobytes())
        fh.write(b"".join(json.dumps(r).encode() + b"\n" for r in ids))
    ref = _seal(tmp, final, len(ids))
    return Segment(ref, final, d[order])


def merge_segments(manifest_path: Path, seq: int, parts: list[Segment]) -> Segment:
    """One segment holding the ids of ``parts``, merged a chunk at a time."""
    n = sum(p.ref.count for p in parts)
    final = _new_path(manifest_path, seq)
    tmp = final.with_name(final.name + ".tmp")
    out = np.empty(n, dtype="<u8")  # written from as it is: no copy of a million digests
    inputs = [(p.digests, p.all_offsets()) for p in parts]
    pos = [0] * len(parts)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _pwrite_all(fd, MAGIC + np.uint64(n).astype("<u8").tobytes(), 0)
        w = 0
        while w < n:
            # every input's next chunk up to the smallest last digest among the chunks with
            # more after them: all that is taken is <= it, all that is left >= it
            ends = [min(pos[j] + MERGE_CHUNK, len(d)) for j, (d, _) in enumerate(inputs)]
            more = [inputs[j][0][ends[j] - 1] for j in range(len(inputs)) if ends[j] < len(inputs[j][0])]
            pivot = min(more) if more else None
            take_d, take_o = [], []
            for j, (d, o) in enumerate(inputs):
                window = d[pos[j] : ends[j]]
                k = len(window) if pivot is None else int(np.searchsorted(window, pivot, side="right"))
                take_d.append(window[:k])
                take_o.append(np.asarray(o[pos[j] : pos[j] + k]))
                pos[j] += k
            dd, oo = np.concatenate(take_d), np.concatenate(take_o)
            order = np.argsort(dd, kind="stable")
            out[w : w + len(dd)] = dd[order]
            _pwrite_all(fd, np.ascontiguousarray(oo[order], dtype="<u8"), HEADER + 8 * (n + w))
            w += len(dd)
        _pwrite_all(fd, out, HEADER)
        at = HEADER + 16 * n
        for p in parts:  # the id lists, one after the other
            start, end = p.ids_blob_range()
            with open(p.path, "rb") as src:
                src.seek(start)
                while start < end:
                    chunk = src.read(min(_COPY, end - start))
                    _pwrite_all(fd, chunk, at)
                    at += len(chunk)
                    start += len(chunk)
    finally:
        os.close(fd)
    del inputs
    ref = _seal(tmp, final, n)
    return Segment(ref, final, out)


def to_merge(parts: list[Segment]) -> int:
    """Where the run of segments to merge into one starts (``len(parts)``: none): the newest
    ones while the one before them is no larger than they are together."""
    i, total = len(parts) - 1, parts[-1].ref.count if parts else 0
    while i > 0 and parts[i - 1].ref.count <= total:
        total += parts[i - 1].ref.count
        i -= 1
    return i if i < len(parts) - 1 else len(parts)


def load_segment(manifest_path: Path, ref: SegmentRef) -> tuple[Segment | None, str | None]:
    """The segment ``ref`` names, checked (its checksum, header and size), or why not."""
    path = manifest_path.with_name(ref.name)
    if not ref.name.startswith(prefix(manifest_path)) or "/" in ref.name:
        return None, f"segment {ref.name!r} is not one of this manifest's"
    try:
        if _checksum(path) != ref.checksum:
            return None, f"segment {ref.name}: its checksum does not match"
        with open(path, "rb") as fh:
            head = fh.read(HEADER)
            if head[:8] != MAGIC or int(np.frombuffer(head[8:], dtype="<u8")[0]) != ref.count:
                return None, f"segment {ref.name}: not a segment of {ref.count} ids"
            d = np.fromfile(fh, dtype="<u8", count=ref.count)  # read into the array: no bytes copy
    except FileNotFoundError:
        return None, f"segment {ref.name} is missing"
    except (OSError, IndexError) as exc:
        return None, f"segment {ref.name}: {exc}"
    if len(d) != ref.count or (ref.count > 1 and bool(np.any(d[1:] < d[:-1]))):
        return None, f"segment {ref.name}: its digests are cut short or not sorted"
    return Segment(ref, path, d), None


def prune(manifest_path: Path, keep: Iterable[SegmentRef]) -> None:
    """Remove this manifest's segment files (and their temp files) that ``keep`` does not list."""
    names = {r.name for r in keep}
    p = prefix(manifest_path)
    for name in os.listdir(manifest_path.parent):
        if name.startswith(p) and name not in names:
            (manifest_path.parent / name).unlink(missing_ok=True)
