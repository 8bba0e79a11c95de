"""GRPO groups: is every rollout of a task's group a trainable outcome?

A group (one task, ``rollout.n_samples`` rollouts) is **complete** when each of its
sample indexes has a recorded policy outcome. An infrastructure failure that outlived
its retries is recorded without Samples, so its group is **incomplete**: it is never
padded with a zero-reward Sample. A trainer that normalizes rewards within a group
(GRPO, RLOO) should train only on complete groups (:func:`complete_groups`), or
normalize over the Samples it has; the run summary counts both kinds
(``cumulative.groups_complete`` / ``groups_incomplete``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from farm.status import RolloutStatus


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


def group_states(rows: Iterable[dict], size: int) -> dict[str, GroupState]:
    """Per group, from rows of the rollouts table (``group_id``, ``sample_index``, ``status``)."""
    groups: dict[str, GroupState] = {}
    for r in rows:
        g = groups.setdefault(r["group_id"], GroupState(r["group_id"], size))
        status = RolloutStatus(r["status"])
        (g.trainable if status.trainable else g.infrastructure).add(int(r["sample_index"]))
    return groups


def group_size_of(out_dir: str | os.PathLike[str]) -> int:
    """``rollout.n_samples`` of the run that wrote ``out_dir`` (from its ``run_config.yaml``)."""
    cfg = yaml.safe_load((Path(out_dir) / "run_config.yaml").read_text()) or {}
    return int(((cfg.get("rollout") or {}).get("n_samples")) or 1)


def read_group_states(out_dir: str | os.PathLike[str], size: int | None = None) -> dict[str, GroupState]:
    from farm.rollout.store import ROLLOUTS_TABLE
    from farm.output.shard_reader import ShardReader

    reader = ShardReader(out_dir, name=ROLLOUTS_TABLE)
    rows = reader.read_table().select(["group_id", "sample_index", "status"]).to_pylist() if reader.entries() else []
    return group_states(rows, size if size is not None else group_size_of(out_dir))


def complete_groups(out_dir: str | os.PathLike[str], size: int | None = None) -> set[str]:
    """Group ids whose every rollout is a trainable outcome: filter Samples on ``group_id``."""
    return {g.group_id for g in read_group_states(out_dir, size).values() if g.complete}
