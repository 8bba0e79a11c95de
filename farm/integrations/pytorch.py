"""PyTorch: a group at a time, as tensors (the row-level dataset is
``farm.output.torch_data.make_torch_dataset``).

``make_group_dataset(out_dir)`` is an ``IterableDataset`` whose items are whole done
groups, for losses that need a group together (GRPO, RLOO). Each item holds the group's
ids and statistics and, per row (every chain of every rollout, in rollout then chain
order), ``tokens`` / ``loss_mask`` / ``rollout_logprobs`` tensors (a list: rows differ
in length), ``prompt_length``, ``reward`` and ``advantage`` tensors. A rollout with
several chains has several rows with the same ``rollout_id`` and the same ``advantage``,
computed over the group's rollouts each counted once (``rows.rollout_advantages``).

Groups are split over DDP ranks and DataLoader workers by a hash of the group id (as
``make_torch_dataset`` splits rollouts): every done group is yielded exactly once across
all of them, reading the directory once or following it.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Iterator

from farm.integrations.rows import rollout_advantages, rows_of
from farm.output.groups import GROUPS_OF_ONE, Group, GroupOrder, GroupReader, GroupsOfOneWarning, group_size_of
from farm.output.torch_data import shard_of, torch_available, worker_shard


def group_tensors(group: Group, *, std_normalize: bool = True) -> dict[str, Any]:
    """One group as tensors (see the module docstring)."""
    # optional extra: torch
    import torch

    rows = rows_of(group, "all")
    adv = rollout_advantages(group, std_normalize=std_normalize)
    return {
        "group_id": group.group_id, "task_id": group.task_id, "group_index": group.group_index,
        "size": group.size, "complete": group.complete,
        "reward_mean": group.reward_mean, "reward_std": group.reward_std,
        "rollout_id": [s.rollout_id for s in rows],
        "sample_index": torch.tensor([s.sample_index for s in rows], dtype=torch.int64),
        "chain_index": torch.tensor([s.chain_index for s in rows], dtype=torch.int64),
        "prompt_length": torch.tensor([s.prompt_length for s in rows], dtype=torch.int64),
        "reward": torch.tensor([float(s.reward or 0.0) for s in rows], dtype=torch.float32),
        "advantage": torch.tensor([adv[s.rollout_id] for s in rows], dtype=torch.float32),
        "tokens": [torch.from_numpy(s.tokens.astype("int64")) for s in rows],
        "loss_mask": [torch.from_numpy(s.loss_mask.copy()) for s in rows],
        "rollout_logprobs": [torch.from_numpy(s.rollout_logprobs.copy()) for s in rows],
    }  # fmt: skip


def make_group_dataset(out_dir: str | os.PathLike[str], *, follow: dict[str, Any] | None = None,
                       rank: int | None = None, world_size: int | None = None, order: GroupOrder = "completion",
                       size: int | None = None, include_incomplete: bool = False) -> Any:
    """An ``IterableDataset`` of groups (``follow``: kwargs of ``GroupReader.follow``;
    with DataLoader workers its ``stop`` must be visible from a worker process). Use it
    with ``batch_size=None`` (items are already whole groups). ``order="task"`` holds a
    group back until every earlier one is done: exact order, but a group that never
    finishes stops the ones after it."""
    if not torch_available():
        raise ImportError("make_group_dataset needs torch (pip install torch); farm does not install it")
    # optional extra: torch
    from torch.utils.data import IterableDataset

    try:
        groups_of = size if size is not None else group_size_of(out_dir)
    except OSError:  # no run_config.yaml yet (a run about to start): its readers find the size then
        groups_of = None
    if groups_of == 1:  # every item's `advantage` would be 0
        warnings.warn(GROUPS_OF_ONE, GroupsOfOneWarning, stacklevel=2)

    class GroupDataset(IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Iterator[dict[str, Any]]:
            shard, shards = worker_shard(rank, world_size)
            # each worker reads the directory itself (a reader is not shared across processes)
            reader = GroupReader(out_dir, size=size, order=order, include_incomplete=include_incomplete,
                                 accept=lambda g: shard_of(g.group_id, shards) == shard)  # fmt: skip
            groups = reader.follow(**follow) if follow is not None else reader.read()
            for g in groups:
                yield group_tensors(g)

    return GroupDataset()
