"""The durable rollout ids of one table, kept compactly, so a writer can refuse a rollout
written twice without holding every id of a run of a million rollouts as a Python string.

The ids a checkpoint covers are its segments' sorted 64-bit digests (xxh3_64: 8 bytes an
id in memory, :mod:`farm.output.segments`); the ids made durable since, strings. A digest
match is confirmed against the manifest line that lists the id before it counts (two ids
share a digest once in ~10^13 at a million ids; a false "already recorded" would drop a
rollout, so membership stays exact): the segment gives that line's offset, so one line is
read; should it not list the id (another id with the same digest, or the manifest
rewritten by a retraction since), the whole manifest is searched. The ids themselves (a
resume's done ids) are read back from the segment files when asked.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from farm.output.manifest import parse_lines
from farm.output.segments import Segment, SegmentRef, digest, merge_segments, to_merge, write_segment

log = logging.getLogger(__name__)
_LINE_CHUNK = 1 << 16


class DurableIds:
    """Membership of one table's durable ids: the segments of the last checkpoint (covered),
    the ids added since (``recent``, strings) and the covered ids retracted since (``gone``)."""

    def __init__(self, manifest_path: Path, table: str) -> None:
        self.manifest_path, self.table = manifest_path, table
        self._segments: list[Segment] = []
        self._covered = 0  # manifest bytes the segments cover (0: none, or stale after a rewrite)
        self._recent: set[str] = set()
        self._gone: set[str] = set()

    def __len__(self) -> int:
        return sum(s.ref.count for s in self._segments) - len(self._gone - self._recent) + len(self._recent)

    def __contains__(self, rollout_id: object) -> bool:
        if not isinstance(rollout_id, str):
            return False
        if rollout_id in self._recent:
            return True
        return rollout_id not in self._gone and self._in_segments(rollout_id)

    @property
    def segments(self) -> list[SegmentRef]:
        return [s.ref for s in self._segments]

    def _in_segments(self, rollout_id: str) -> bool:
        d = np.uint64(digest(rollout_id))
        offsets: list[int] = []
        matched = False
        for s in self._segments:
            lo, hi = np.searchsorted(s.digests, d, side="left"), np.searchsorted(s.digests, d, side="right")
            if hi > lo:
                matched = True
                try:
                    offsets += s.offsets(int(lo), int(hi)).tolist()
                except OSError:  # merged away by a checkpoint in the commit thread just now
                    pass
        if not matched:
            return False
        return any(self._line_lists(at, rollout_id) for at in offsets) or self._listed(rollout_id)

    def _line_lists(self, at: int, rollout_id: str) -> bool:
        """Whether the manifest line starting at byte ``at`` lists ``rollout_id``."""
        try:
            with open(self.manifest_path, "rb") as fh:
                if at:
                    fh.seek(at - 1)
                    if fh.read(1) != b"\n":
                        return False  # not the start of a line (the manifest was rewritten)
                line = b""
                while not line.endswith(b"\n"):
                    chunk = fh.read(_LINE_CHUNK)
                    if not chunk:
                        return False  # a torn last line lists nothing
                    nl = chunk.find(b"\n")
                    line += chunk if nl < 0 else chunk[: nl + 1]
            entry = json.loads(line)
        except (OSError, ValueError):
            return False
        if not isinstance(entry, dict) or entry.get("table") != self.table:
            return False
        return rollout_id in (entry.get("rollout_ids") or ())

    def _listed(self, rollout_id: str) -> bool:
        """Whether any manifest line of this table lists ``rollout_id`` (found by its JSON
        text, then that line parsed): only when the line a digest points at does not."""
        needle = json.dumps(rollout_id).encode()
        try:
            data = self.manifest_path.read_bytes()
        except FileNotFoundError:
            return False
        at = data.find(needle)
        while at >= 0:
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            if end < 0:
                return False  # a torn last line lists nothing
            for e in parse_lines(data[start : end + 1], path=self.manifest_path).entries:
                if e.table == self.table and rollout_id in e.rollout_ids:
                    return True
            at = data.find(needle, end)
        return False

    def add(self, ids: Iterable[str]) -> None:
        self._recent.update(ids)

    def discard(self, ids: Iterable[str]) -> None:
        """Durable ``ids`` were retracted (the manifest rewritten without them): those not
        added since the checkpoint are covered ones."""
        ids = set(ids)
        self._gone.update(ids - self._recent)
        self._recent.difference_update(ids)
        self._covered = 0  # the segments' offsets point into the manifest before the rewrite

    def ids(self) -> set[str]:
        """Every durable id (the covered ones read back from the segment files)."""
        while True:
            # recent before segments: a checkpoint in the commit thread sets its segments
            # before it clears the recent ids, so this sees each id in one or the other
            recent, gone, segments = set(self._recent), set(self._gone), self._segments
            try:
                out: set[str] = set()
                for s in segments:
                    out.update(s.ids())
                break
            except FileNotFoundError:  # a segment merged away meanwhile: again, with the new ones
                continue
        out.difference_update(gone)
        out.update(recent)
        return out

    def cover(self, segments: list[Segment], covered: int) -> None:
        """The segments of a checkpoint this writer trusts, covering the manifest's first
        ``covered`` bytes (the checkpoint it opened from)."""
        self._segments, self._covered = list(segments), covered
        self._recent, self._gone = set(), set()

    def seal(self, end: int, seq: int) -> tuple[int, list[Segment]]:
        """Write what the manifest's lines up to ``end`` add to the segments: the lines after
        the bytes they cover (all of them when none are, or after a rewrite), as a new
        segment, merged with the newest ones when they are as large (``to_merge``). Returns
        the next segment number and the segments a checkpoint covering ``end`` lists; the
        caller then calls ``cover`` once that checkpoint is written."""
        start = self._covered
        ids, offsets = self._listed_since(start, end)
        if start and len(set(ids)) != len(self._recent):  # never seen: the lines are this writer's
            log.warning("%s: %d ids in the lines since byte %d, %d added since the checkpoint: segments "
                        "rebuilt from the whole manifest", self.manifest_path, len(set(ids)), start, len(self._recent))
            start = 0
            ids, offsets = self._listed_since(start, end)
        parts = list(self._segments) if start else []
        if ids:
            parts.append(write_segment(self.manifest_path, seq, ids, offsets))
            seq += 1
        i = to_merge(parts)
        if i < len(parts):
            parts = parts[:i] + [merge_segments(self.manifest_path, seq, parts[i:])]
            seq += 1
        return seq, parts

    def _listed_since(self, start: int, end: int) -> tuple[list[str], list[int]]:
        """(id, offset of the line listing it) for this table's lines in bytes ``start:end``."""
        ids: list[str] = []
        offsets: list[int] = []
        if end <= start:
            return ids, offsets
        with open(self.manifest_path, "rb") as fh:
            fh.seek(start)
            data = fh.read(end - start)
        at = 0
        while at < len(data):
            nl = data.find(b"\n", at)
            if nl < 0:
                break
            line = data[at:nl].strip()
            if line:
                entry = json.loads(line)
                if entry.get("table") == self.table:
                    ids += entry["rollout_ids"]
                    offsets += [start + at] * len(entry["rollout_ids"])
            at = nl + 1
        return ids, offsets
