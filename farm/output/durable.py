"""The durable rollout ids of one table, kept compactly, so a writer can refuse a rollout
written twice without holding every id of a run of a million rollouts as a Python string.

The ids a checkpoint covers (:mod:`farm.output.checkpoint`) are kept as a sorted array
of 64-bit digests (xxh3_64: 8 bytes an id, against ~100 for a string in a set); the ids
made durable since, as strings. A digest match is confirmed against the manifest line
that lists the id before it counts (two ids share a digest once in ~10^13 at a million
ids): a false "already recorded" would drop a rollout, so membership stays exact. The
ids themselves (a resume's done ids) are read back from the checkpoint file when asked.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import xxhash

from farm.output.manifest import parse_lines


def digest(rollout_id: str) -> int:
    return xxhash.xxh3_64_intdigest(rollout_id.encode())


def digests(ids: Iterable[str], *, sort: bool = True) -> np.ndarray:
    out = np.fromiter((digest(r) for r in ids), dtype=np.uint64)
    return np.sort(out) if sort else out


class DurableIds:
    """Membership of one table's durable ids: ``covered`` (sorted digests of the ids the
    last checkpoint lists, read back with ``load_covered``) and ``recent`` (strings)."""

    def __init__(self, manifest_path: Path, table: str, load_covered: Callable[[], Iterable[str]]) -> None:
        self.manifest_path, self.table = manifest_path, table
        self._load_covered = load_covered
        self._covered = np.empty(0, dtype=np.uint64)
        self._recent: set[str] = set()
        self._discarded = False  # a covered id was taken out since the checkpoint (retracted)

    def __len__(self) -> int:
        return len(self._covered) + len(self._recent)

    def __contains__(self, rollout_id: object) -> bool:
        if not isinstance(rollout_id, str):
            return False
        if rollout_id in self._recent:
            return True
        return self._covered_has(rollout_id) and self._listed(rollout_id)

    def _covered_has(self, rollout_id: str) -> bool:
        d = np.uint64(digest(rollout_id))
        i = int(np.searchsorted(self._covered, d))
        return i < len(self._covered) and self._covered[i] == d

    def _listed(self, rollout_id: str) -> bool:
        """Whether a manifest line of this table lists ``rollout_id`` (found by its JSON
        text, then that line parsed): rare, only on a digest match."""
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
        drop = [rid for rid in ids if rid not in self._recent and self._covered_has(rid)]
        self._recent.difference_update(ids)
        if drop:
            keep = ~np.isin(self._covered, digests(drop))
            self._covered = self._covered[keep]
            self._discarded = True

    def ids(self) -> set[str]:
        """Every durable id (the covered ones read back from the checkpoint)."""
        out = set(self._recent)
        if len(self._covered):
            covered = self._load_covered()
            if self._discarded:  # leave out the ones retracted since
                covered = list(covered)
                keep = np.isin(digests(covered, sort=False), self._covered).tolist()
                covered = (rid for rid, k in zip(covered, keep) if k)
            out.update(covered)
        return out

    def merged(self) -> np.ndarray:
        """The sorted digests of every durable id (what a new checkpoint stores)."""
        return np.sort(np.concatenate([self._covered, digests(self._recent, sort=False)]))

    def cover(self, covered: np.ndarray) -> None:
        """A checkpoint now lists every durable id: ``covered`` is their sorted digests
        (``merged()`` when this writer wrote it, the checkpoint's when it opened from one)."""
        self._covered = covered
        self._recent, self._discarded = set(), False


def encode_digests(d: np.ndarray) -> str:
    return base64.b64encode(d.astype("<u8").tobytes()).decode()


def decode_digests(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u8").astype(np.uint64)
