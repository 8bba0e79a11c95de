"""Groups as the unit a trainer consumes: all n Samples of a task's group at once,
with its statistics, as soon as the group is done, following a run in progress.

A group is **done** when each of its ``size`` rollouts is recorded (any status) and
every Sample those rollouts promise (the rollouts table's ``num_samples``) is readable.
It is **complete** when every one of its rollouts is a trainable outcome. A rollout
that failed for infrastructure reasons was already retried (``rollout.infra_retries``)
before it was recorded; its group is then *incomplete*: left out by default and
counted in ``GroupReader.incomplete``, never yielded short or padded.

Order: ``"completion"`` yields groups as they become done; ``"task"`` in the order of
the run's task stream (``group_index``), holding a done group back until every group
before it is done. Both read only what the manifests name, so a reader never sees a
partial shard, and each rollout counts once.

Group completeness (the run summary's counts, ``complete_groups``):
A group (one task, ``rollout.n_samples`` rollouts) is **complete** when each of its
sample indexes has a recorded policy outcome. An infrastructure failure that outlived
its retries is recorded without Samples, so its group is **incomplete**: it is never
padded with a zero-reward Sample. A trainer that normalizes rewards within a group
(GRPO, RLOO) should train only on complete groups (:func:`complete_groups`), or
normalize over the Samples it has; the run summary counts both kinds
(``cumulative.groups_complete`` / ``groups_incomplete``).
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import yaml

from farm.errors import CursorError
from farm.output.cursor import GroupCursor, HeldGroup, TablePosition
from farm.output.manifest import ManifestEntry
from farm.output.rows import migrate_rollouts
from farm.status import RolloutStatus
from farm.output.shard_reader import ManifestTail, ShardReader, Stop, polling
from farm.trajectory.schema import Sample, table_to_samples
from farm.output.reader import ROLLOUTS_TABLE, SAMPLES_TABLE


@dataclass
class GroupState:
    group_id: str
    size: int  # rollouts the group should have (n_samples)
    trainable: set[int] = field(default_factory=set)  # sample indexes with a policy outcome
    infrastructure: set[int] = field(default_factory=set)  # sample indexes recorded as infrastructure failures

    @property
    def complete(self) -> bool:
        return len(self.trainable) >= self.size

    @property
    def missing(self) -> int:
        """Rollouts without a trainable outcome (failed or not run yet)."""
        return max(0, self.size - len(self.trainable))

    def add(self, index: int, status: RolloutStatus) -> None:
        """A recorded rollout of the group: its sample index and status."""
        (self.trainable if status.trainable else self.infrastructure).add(int(index))


def group_states(rows: Iterable[dict], size: int) -> dict[str, GroupState]:
    """Per group, from rows of the rollouts table (``group_id``, ``sample_index``, ``status``)."""
    groups: dict[str, GroupState] = {}
    for r in rows:
        g = groups.setdefault(r["group_id"], GroupState(r["group_id"], size))
        g.add(r["sample_index"], RolloutStatus(r["status"]))
    return groups


class GroupsOfOneWarning(UserWarning):
    """Group-relative advantages asked for on groups of one rollout: each is 0."""


# said where a trainer asks for group advantages and at a run's start (farm run, farm.Farm)
GROUPS_OF_ONE = (
    "groups of one rollout (rollout.n_samples: 1): a group-relative advantage (reward - the group's mean "
    "reward, GRPO's baseline) is 0 for every rollout, so a trainer learns nothing from them; run with "
    "rollout.n_samples >= 2 (e.g. --set rollout.n_samples=4) for groups to train on"
)


def group_size_of(out_dir: str | os.PathLike[str]) -> int:
    """``rollout.n_samples`` of the run that wrote ``out_dir`` (from its ``run_config.yaml``)."""
    cfg = yaml.safe_load((Path(out_dir) / "run_config.yaml").read_text()) or {}
    return int(((cfg.get("rollout") or {}).get("n_samples")) or 1)


def read_group_states(out_dir: str | os.PathLike[str], size: int | None = None) -> dict[str, GroupState]:
    reader = ShardReader(out_dir, name=ROLLOUTS_TABLE)
    rows = reader.read_table().select(["group_id", "sample_index", "status"]).to_pylist() if reader.entries() else []
    return group_states(rows, size if size is not None else group_size_of(out_dir))


def complete_groups(out_dir: str | os.PathLike[str], size: int | None = None) -> set[str]:
    """Group ids whose every rollout is a trainable outcome: filter Samples on ``group_id``."""
    return {g.group_id for g in read_group_states(out_dir, size).values() if g.complete}


GroupOrder = Literal["completion", "task"]
CLOSED_GROUPS = 65_536  # group ids a reader remembers having handed out (see GroupReader._closed)
BUILT_GROUPS = 4_096  # handed-out groups whose Sample shards a reader remembers (``position(unconsumed=...)``)
# rollouts-table columns a group carries (the diff and the log tail stay in the table)
ROW_COLUMNS = [
    "rollout_id", "group_id", "task_id", "sample_index", "group_index", "attempt", "status", "reason", "reward",
    "grading", "turns", "num_samples", "policy_version_min", "policy_version_max", "policy_version_at_finish",
    "duration_s",
]  # fmt: skip


def _resolved(row: dict[str, Any]) -> bool:
    if row["status"] not in (RolloutStatus.COMPLETED.value, RolloutStatus.TRUNCATED.value):  # graded outcomes
        return False
    try:
        report = json.loads(row.get("grading") or "{}")
    except ValueError:
        report = {}
    if isinstance(report, dict) and "resolved" in report:
        return bool(report["resolved"])
    return float(row.get("reward") or 0.0) >= 1.0


@dataclass(frozen=True)
class Group:
    """One task's group: its rollouts (rollouts-table rows, by sample index) and the
    Samples of its trainable ones (by sample index, then chain index)."""

    group_id: str
    task_id: str
    group_index: int | None
    size: int
    rollouts: list[dict[str, Any]]
    samples: list[Sample]
    complete: bool

    @property
    def rewards(self) -> list[float]:
        """One reward per rollout with a trainable outcome, by sample index."""
        return [float(r["reward"]) for r in self.rollouts if RolloutStatus(r["status"]).trainable]

    @property
    def reward_mean(self) -> float:
        return float(np.mean(self.rewards)) if self.rewards else math.nan

    @property
    def reward_std(self) -> float:
        """Sample standard deviation (ddof=1, what TRL's and slime's GRPO normalize by;
        0.0 for a single reward)."""
        r = self.rewards
        return float(np.std(r, ddof=1)) if len(r) > 1 else (0.0 if r else math.nan)

    @property
    def resolved(self) -> int:
        return sum(1 for r in self.rollouts if _resolved(r))

    @property
    def policy_versions(self) -> tuple[int | None, int | None]:
        """(oldest, newest) weight version of any trained turn in the group."""
        lo = [s.policy_version_min for s in self.samples if s.policy_version_min is not None]
        hi = [s.policy_version_max for s in self.samples if s.policy_version_max is not None]
        return (min(lo) if lo else None, max(hi) if hi else None)

    def samples_of(self, sample_index: int) -> list[Sample]:
        return [s for s in self.samples if s.sample_index == sample_index]

    def stats(self) -> dict[str, Any]:
        lo, hi = self.policy_versions
        return {
            "group_id": self.group_id, "task_id": self.task_id, "group_index": self.group_index,
            "size": self.size, "complete": self.complete, "rewards": self.rewards,
            "reward_mean": self.reward_mean, "reward_std": self.reward_std, "resolved": self.resolved,
            "samples": len(self.samples), "policy_version_min": lo, "policy_version_max": hi,
        }  # fmt: skip


@dataclass
class _Pending:
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # sample index -> first recorded row
    seen_at: int = 0  # arrival order of the group's first row (completion order ties)


class GroupReader:
    """Reads an output directory group by group (``read``), or follows it (``follow``)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        size: int | None = None,
        order: GroupOrder = "completion",
        include_incomplete: bool = False,
        verify: bool = True,
        first_index: int = 0,
        accept: Callable[[Group], bool] | None = None,
        cursor: GroupCursor | None = None,
    ) -> None:
        """``cursor``: start where a reader's ``position()`` was taken (see :meth:`seek`)."""
        if order not in ("completion", "task"):
            raise ValueError(f"order must be 'completion' or 'task', not {order!r}")
        self.directory = Path(directory)
        self.size = size if size is not None else group_size_of(self.directory)
        self.order, self.include_incomplete, self.accept = order, include_incomplete, accept

        self._rollouts = ShardReader(self.directory, name=ROLLOUTS_TABLE, verify=verify, migrate=migrate_rollouts)
        self._samples = ShardReader(self.directory, name=SAMPLES_TABLE, verify=verify)
        # each poll reads only the manifest lines added since the last one
        self._rollout_tail = ManifestTail(self._rollouts.manifest_path, ROLLOUTS_TABLE)
        self._sample_tail = ManifestTail(self._samples.manifest_path, SAMPLES_TABLE)
        self._samples_by_rollout: dict[str, list[Sample]] = {}
        # the Sample shard each rollout's Samples came from (a cursor names it, not the Samples)
        self._sample_entry: dict[str, ManifestEntry] = {}
        # the same for the last groups built: a caller may hand them back unconsumed (``position``)
        self._built: OrderedDict[str, dict[str, ManifestEntry]] = OrderedDict()
        self._replay: list[Group] = []  # unconsumed groups of a cursor: handed out first
        # Groups handed out (or left out) last: a row of one of them that shows up again (its
        # rollout retracted and rewritten) does not start the group over. A window, so a
        # reader following a run of a million rollouts keeps no id per rollout.
        self._closed: deque[str] = deque()
        self._closed_ids: set[str] = set()
        self._pending: dict[str, _Pending] = {}
        self._done: dict[int, Group] = {}  # task order: done groups waiting for earlier ones, by group index
        self._next_index = first_index
        self._arrivals = 0
        self.yielded = 0
        self.incomplete: list[str] = []  # group ids that ended incomplete (left out unless include_incomplete)
        self.rejected: list[str] = []  # group ids ``accept`` turned down
        self._polled = False
        if cursor is not None:
            self.seek(cursor)

    # --- one look at the manifests -------------------------------------------------
    def poll(self) -> list[Group]:
        """Groups that became done since the last call (in this reader's order)."""
        self._polled = True
        # Samples first: the reducer commits a rollout's Samples before its row.
        for entry in self._sample_tail.new_entries():
            self._take_samples(entry)
        for entry in self._rollout_tail.new_entries():
            table = self._rollouts.read_shard(entry).select(ROW_COLUMNS)
            for row in table.to_pylist():
                if row["group_id"] in self._closed_ids:  # a rollout counts once
                    continue
                pending = self._pending.setdefault(row["group_id"], _Pending(seen_at=self._arrivals))
                self._arrivals += 1
                pending.rows.setdefault(int(row["sample_index"]), row)  # the first row of a sample index
        replay, self._replay = self._replay, []
        self.yielded += len(replay)
        return replay + self._emit(self._finished())

    def _take_samples(self, entry: ManifestEntry, only: set[str] | None = None) -> None:
        for s in table_to_samples(self._samples.read_shard(entry)):
            if only is None or s.rollout_id in only:
                self._samples_by_rollout.setdefault(s.rollout_id, []).append(s)
                self._sample_entry[s.rollout_id] = entry

    def _finished(self) -> list[Group]:
        out = []
        for gid, pending in sorted(self._pending.items(), key=lambda kv: kv[1].seen_at):
            if len(pending.rows) < self.size:
                continue
            rows = [pending.rows[i] for i in sorted(pending.rows)]
            if any(len(self._samples_by_rollout.get(r["rollout_id"], [])) < int(r["num_samples"] or 0) for r in rows):
                continue  # a Sample shard not visible yet
            del self._pending[gid]
            self._closed.append(gid)
            self._closed_ids.add(gid)
            while len(self._closed) > CLOSED_GROUPS:
                self._closed_ids.discard(self._closed.popleft())
            out.append(self._build(gid, rows))
        return out

    def _build(self, gid: str, rows: list[dict[str, Any]]) -> Group:
        """The group of ``rows`` (by sample index), its Samples taken out of the buffer."""
        samples = [s for r in rows for s in sorted(self._samples_by_rollout.pop(r["rollout_id"], []),
                                                    key=lambda s: s.chain_index)]  # fmt: skip
        self._built[gid] = {r["rollout_id"]: e for r in rows
                            if (e := self._sample_entry.pop(r["rollout_id"], None)) is not None}  # fmt: skip
        while len(self._built) > BUILT_GROUPS:
            self._built.popitem(last=False)
        return Group(
            group_id=gid, task_id=rows[0]["task_id"], group_index=rows[0]["group_index"], size=self.size,
            rollouts=rows, samples=samples, complete=all(RolloutStatus(r["status"]).trainable for r in rows),
        )  # fmt: skip

    def _emit(self, finished: list[Group]) -> list[Group]:
        if self.order == "task":
            ordered: list[Group] = []
            for g in finished:
                if g.group_index is None:
                    ordered.append(g)  # a run written before group indexes: arrival order
                else:
                    self._done[g.group_index] = g
            while self._next_index in self._done:
                ordered.append(self._done.pop(self._next_index))
                self._next_index += 1
            finished = ordered
        out = []
        for g in finished:
            if not g.complete and not self.include_incomplete:
                self.incomplete.append(g.group_id)
                continue
            if self.accept is not None and not self.accept(g):
                self.rejected.append(g.group_id)
                continue
            out.append(g)
        self.yielded += len(out)
        return out

    # --- resuming ---------------------------------------------------------------------
    def position(self, unconsumed: Iterable[Group] = ()) -> GroupCursor:
        """Where this reader is: a :class:`~farm.output.cursor.GroupCursor` a new reader
        resumes from (``GroupReader(dir, cursor=...)``) without reading the manifest lines
        before it. ``unconsumed``: groups this reader handed out that the caller did not
        consume (a source's buffer): the resumed reader hands them out first. Groups ``poll``
        left out (incomplete, rejected) are not handed out again."""
        back = list(unconsumed)
        entries: dict[str, tuple[ManifestEntry, list[str]]] = {}  # shard -> (its line, rollout ids needed)

        def need(rid: str, entry: ManifestEntry | None) -> None:
            if entry is not None:
                entries.setdefault(entry.shard, (entry, []))[1].append(rid)

        def built(g: Group) -> HeldGroup:
            sources = self._built.get(g.group_id)
            if sources is None and any(int(r["num_samples"] or 0) for r in g.rollouts):
                raise CursorError(f"group {g.group_id} was not handed out by this reader in its last "
                                  f"{BUILT_GROUPS} groups: cannot say where its Samples are")  # fmt: skip
            for r in g.rollouts:
                need(r["rollout_id"], (sources or {}).get(r["rollout_id"]))
            return HeldGroup(group_id=g.group_id, rows=list(g.rollouts))

        held = [built(g) for g in self._done.values()]
        replay = [built(g) for g in [*self._replay, *back]]
        for rid, entry in self._sample_entry.items():  # pending groups' Samples, and rows not read yet
            need(rid, entry)
        pending = [HeldGroup(group_id=gid, rows=[p.rows[i] for i in sorted(p.rows)], seen_at=p.seen_at)
                   for gid, p in self._pending.items()]  # fmt: skip
        return GroupCursor(
            size=self.size, order=self.order, next_index=self._next_index, yielded=self.yielded - len(back),
            tables={SAMPLES_TABLE: TablePosition.at(self._samples.manifest_path, self._sample_tail.offset),
                    ROLLOUTS_TABLE: TablePosition.at(self._rollouts.manifest_path, self._rollout_tail.offset)},
            pending=pending, held=held, unconsumed=replay,
            sample_shards=[{"entry": e.model_dump(), "rollout_ids": ids} for e, ids in entries.values()],
        )  # fmt: skip

    def seek(self, cursor: GroupCursor) -> None:
        """Continue from ``cursor`` (a fresh reader only): the manifests are read from its
        offsets on, never before; its groups' Sample shards are read again. Raises
        ``CursorError`` when it does not fit this directory or reader (a manifest rewritten
        since it was taken, another group size or order)."""
        if self._polled:
            raise CursorError("seek() needs a reader that has not read yet")
        if (cursor.size, cursor.order) != (self.size, self.order):
            raise CursorError(f"the cursor is of a reader with size={cursor.size}, order={cursor.order!r}; "
                              f"this one has size={self.size}, order={self.order!r}")  # fmt: skip
        tails = {SAMPLES_TABLE: self._sample_tail, ROLLOUTS_TABLE: self._rollout_tail}
        for table, tail in tails.items():
            pos = cursor.tables.get(table)
            if pos is None:
                raise CursorError(f"the cursor has no position for the {table!r} table")
            why = pos.mismatch(tail.path)
            if why is not None:
                raise CursorError(f"stale group cursor for {self.directory}: {why}; "
                                  f"read from the start (a reader without a cursor) instead")  # fmt: skip
        for item in cursor.sample_shards:
            try:
                entry = ManifestEntry.model_validate(item["entry"])
            except (ValueError, KeyError, TypeError) as exc:
                raise CursorError(f"not a group cursor: a sample shard entry is invalid: {exc}") from None
            self._take_samples(entry, only=set(item["rollout_ids"]))
        for table, tail in tails.items():
            tail.seek(cursor.tables[table].offset)
        self._next_index, self.yielded = cursor.next_index, cursor.yielded
        for g in cursor.pending:
            self._pending[g.group_id] = _Pending(rows={int(r["sample_index"]): r for r in g.rows}, seen_at=g.seen_at)
            self._arrivals = max(self._arrivals, g.seen_at + 1)
        for g in cursor.held:
            built = self._build(g.group_id, g.rows)
            self._done[built.group_index] = built  # type: ignore[index]
        self._replay = [self._build(g.group_id, g.rows) for g in cursor.unconsumed]
        for gid in [*(g.group_id for g in cursor.held), *(g.group_id for g in cursor.unconsumed)]:
            self._closed.append(gid)
            self._closed_ids.add(gid)

    # --- whole directory / following ---------------------------------------------
    def read(self) -> list[Group]:
        """Every group done so far."""
        return self.poll()

    def follow(self, *, poll_interval: float = 0.5, stop: Stop | None = None,
               timeout: float | None = None) -> Iterator[Group]:
        """Yield groups as they become done. Ends when ``stop`` is set / returns True
        (after a last look) or after ``timeout`` seconds; one of them is required."""
        for _ in polling(poll_interval=poll_interval, stop=stop, timeout=timeout):
            yield from self.poll()
