"""What a table's rows add up to, folded one shard at a time, and kept in the table's
manifest checkpoint (its ``counts``) as the writer writes it: the run's end (summary.json's
``cumulative`` and ``fidelity``) and ``farm inspect`` read the checkpoint and the rows after
it, not every row of a run of a million rollouts.

- :class:`RolloutsTally` (the rollouts table): counts by status and failure class,
  retried, resolved, the reward sum (exact: Shewchuk's partials, so a sum folded in pieces
  equals ``math.fsum`` over the whole list), grading flags, hack actions, turns, output
  tokens, and group completeness. A complete group (every one of its ``group_size``
  sample indexes a trainable outcome) is counted and forgotten: a group's rollouts are its
  indexes ``0..group_size-1``, each recorded once (``make_rollout_id``), so a complete group
  gets no more rows. What is kept is one small state per *incomplete* group: the groups in
  flight and those with an infrastructure failure that outlived its retries (never padded,
  incomplete for good): it grows with failed groups, not with rollouts. A row whose sample
  index is outside ``0..group_size-1`` (a directory written with a larger ``n_samples``)
  makes the tally inexact: a reader then folds every row keeping every group.
- :class:`FidelityTally` (the Samples table): the token-fidelity totals
  (:mod:`farm.output.fidelity`).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from farm.output.groups import GroupState
from farm.status import RolloutStatus
from farm.output.checkpoint import read_checkpoint
from farm.output.manifest import read_manifest
from farm.output.reader import OutputReader, open_sample_reader

RESOLVED_REWARD = 1.0
ROLLOUT_COLUMNS = ["status", "reward", "attempt", "group_id", "sample_index", "grading", "turns", "output_tokens"]
KINDS = ("model_output", "tool_result", "template")
COUNTS_VERSION = 1
T = TypeVar("T", bound="RolloutsTally")


class RolloutsTally:
    """The rollouts table's rows, folded (see the module doc). ``keep_complete``: complete
    groups are kept too (exact whatever the sample indexes; memory grows with groups)."""

    kind = "rollouts"

    def __init__(self, group_size: int = 1, *, keep_complete: bool = False) -> None:
        self.group_size, self.keep_complete = group_size, keep_complete
        self.rollouts = self.retried = self.resolved = self.policy = 0
        self.turns = self.output_tokens = 0
        self._partials: list[float] = []  # the reward sum over policy outcomes, exactly
        self.by_status: Counter[str] = Counter()
        self.by_class: Counter[str] = Counter()
        self.flags: Counter[str] = Counter()
        self.actions: Counter[str] = Counter()
        self.groups: dict[str, GroupState] = {}  # the incomplete ones (all of them with keep_complete)
        self.groups_done = 0  # complete groups counted and forgotten
        self.exact = True

    @property
    def reward_sum(self) -> float:
        return math.fsum(self._partials)

    def add(self, rows: Iterable[dict]) -> None:
        for r in rows:
            status = RolloutStatus(r["status"])
            self.rollouts += 1
            self.by_status[r["status"]] += 1
            self.by_class[status.failure_class.value] += 1
            self.retried += (r.get("attempt") or 1) > 1
            self.turns += r.get("turns") or 0
            self.output_tokens += r.get("output_tokens") or 0
            if status.trainable:
                self.policy += 1
                self.resolved += r["reward"] >= RESOLVED_REWARD
                _add_exact(self._partials, float(r["reward"]))
            if "group_id" in r:
                self._group(r["group_id"], int(r["sample_index"]), status)
            report = _grading(r.get("grading"))
            self.flags.update(set(report.get("flags") or ()))
            if report.get("hack_action") in ("zero_reward", "exclude"):
                self.actions[report["hack_action"]] += 1

    def _group(self, group_id: str, index: int, status: RolloutStatus) -> None:
        if not 0 <= index < self.group_size:
            self.exact = self.exact and self.keep_complete
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = GroupState(group_id, self.group_size)
        g.add(index, status)
        if g.complete and not self.keep_complete:
            del self.groups[group_id]
            self.groups_done += 1

    @property
    def groups_total(self) -> int:
        return self.groups_done + len(self.groups)

    def incomplete(self) -> list[str]:
        return sorted(g.group_id for g in self.groups.values() if not g.complete)

    def to_counts(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": COUNTS_VERSION, "group_size": self.group_size, "exact": self.exact,
                "rollouts": self.rollouts, "retried": self.retried, "resolved": self.resolved, "policy": self.policy,
                "turns": self.turns, "output_tokens": self.output_tokens, "reward_partials": self._partials,
                "by_status": dict(self.by_status), "by_class": dict(self.by_class), "flags": dict(self.flags),
                "actions": dict(self.actions), "groups_done": self.groups_done,
                "groups": [[g.group_id, sorted(g.trainable), sorted(g.infrastructure)]
                           for g in self.groups.values()]}  # fmt: skip

    @classmethod
    def from_counts(cls: type[T], counts: dict[str, Any] | None, group_size: int) -> T | None:
        """The tally a checkpoint kept, if it is one for ``group_size`` and exact (else None)."""
        if not counts or counts.get("kind") != cls.kind or counts.get("version") != COUNTS_VERSION:
            return None
        if counts["group_size"] != group_size or not counts["exact"]:
            return None
        t = cls(group_size)
        for k in ("rollouts", "retried", "resolved", "policy", "turns", "output_tokens", "groups_done"):
            setattr(t, k, int(counts[k]))
        t._partials = [float(x) for x in counts["reward_partials"]]
        for k in ("by_status", "by_class", "flags", "actions"):
            setattr(t, k, Counter(counts[k]))
        for gid, trainable, infra in counts["groups"]:
            t.groups[gid] = GroupState(gid, group_size, set(trainable), set(infra))
        return t


class FidelityTally:
    """Token-fidelity totals of measured Samples (``farm.gateway.fidelity`` records)."""

    kind = "fidelity"

    def __init__(self) -> None:
        self.n = self.seen = self.differing = self.with_differences = self.specials = 0
        self.kinds = dict.fromkeys(KINDS, 0)

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            self.n += 1
            self.seen += r["seen_tokens"]
            self.differing += r["differing_tokens"]
            self.with_differences += bool(r["differing_tokens"])
            self.specials += r.get("special_tokens_in_content", 0)  # special-token text in content (older: none)
            for k in KINDS:
                self.kinds[k] += r[k]

    def add_metadata(self, metadata: Iterable[str | None]) -> None:
        """Samples' ``metadata`` column (JSON): their fidelity records, where measured."""
        self.add(fid for fid in (fidelity_of(m) for m in metadata) if fid is not None)

    def totals(self) -> dict[str, Any]:
        seen, differing = self.seen, self.differing
        return {"samples_measured": self.n, "context_tokens": seen, "differing_tokens": differing,
                "differing_pct": round(100 * differing / seen, 3) if seen else 0.0,
                "samples_with_differences": self.with_differences, **self.kinds,
                "special_tokens_in_content": self.specials}  # fmt: skip

    def to_counts(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": COUNTS_VERSION, "n": self.n, "seen": self.seen,
                "differing": self.differing, "with_differences": self.with_differences, "specials": self.specials,
                "kinds": dict(self.kinds)}  # fmt: skip

    @classmethod
    def from_counts(cls, counts: dict[str, Any] | None) -> FidelityTally | None:
        if not counts or counts.get("kind") != cls.kind or counts.get("version") != COUNTS_VERSION:
            return None
        t = cls()
        t.n, t.seen, t.differing = int(counts["n"]), int(counts["seen"]), int(counts["differing"])
        t.with_differences, t.specials = int(counts["with_differences"]), int(counts["specials"])
        t.kinds = {k: int(counts["kinds"].get(k, 0)) for k in KINDS}
        return t


def fidelity_of(metadata: str | None) -> dict[str, Any] | None:
    """A Sample's fidelity record (None: not measured, or the measure failed)."""
    fid = json.loads(metadata).get("fidelity") if metadata else None
    return fid if fid and "error" not in fid else None


def _add_exact(partials: list[float], x: float) -> None:
    """Add ``x`` to the non-overlapping partials of an exact sum (Shewchuk; math.fsum's own)."""
    i = 0
    for y in partials:
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo:
            partials[i] = lo
            i += 1
        x = hi
    partials[i:] = [x]


def _grading(raw: str | None) -> dict:
    try:
        out = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def directory_rollouts(out_dir: str | os.PathLike[str], group_size: int = 1,
                       kind: type[T] = RolloutsTally) -> T:  # type: ignore[assignment]  # fmt: skip
    """The rollouts table of ``out_dir`` folded (into a ``kind``): its checkpoint's counts
    (when kept for ``group_size``) and the rows after it, one shard at a time; every row
    without them."""
    reader = OutputReader(out_dir).rollouts()
    tally, entries = _since_checkpoint(reader, lambda c: kind.from_counts(c, group_size))
    if tally is None:
        tally, entries = kind(group_size), reader.entries()
    for entry in entries:
        tally.add(reader.read_shard(entry).select(ROLLOUT_COLUMNS).to_pylist())
    if not tally.exact:  # sample indexes past the group size: every group kept, every row read
        tally = kind(group_size, keep_complete=True)
        for entry in reader.entries():
            tally.add(reader.read_shard(entry).select(ROLLOUT_COLUMNS).to_pylist())
    return tally


def directory_fidelity(out_dir: str | os.PathLike[str]) -> FidelityTally:
    """The token-fidelity totals of ``out_dir``'s Samples: the Samples checkpoint's counts
    and the Samples after it (every Sample without them)."""
    reader = open_sample_reader(out_dir)
    tally, entries = _since_checkpoint(reader, FidelityTally.from_counts)
    if tally is None:
        tally, entries = FidelityTally(), reader.entries()
    for entry in entries:
        tally.add_metadata(reader.read_shard(entry).column("metadata").to_pylist())
    return tally


def _since_checkpoint(reader: Any, make: Any) -> tuple[Any, list[Any]]:
    """(the tally the table's checkpoint kept, the entries after it), or (None, [])."""

    cp = read_checkpoint(Path(reader.manifest_path), reader.name)
    tally = make(cp.counts) if cp is not None else None
    if tally is None:
        return None, []
    seen: set[str] = set()
    tail = []
    for e in read_manifest(reader.manifest_path, cp.offset).entries:
        if e.table == reader.name and e.shard not in seen:
            seen.add(e.shard)
            tail.append(e)
    return tally, tail
