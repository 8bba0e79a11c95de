"""Optional torch ``IterableDataset`` over Sample shards (only if torch is installed).

farm does not depend on torch; ``make_torch_dataset`` raises ``ImportError`` with a
clear message when it is missing. Each item is a dict of the Sample's columns with
``tokens`` / ``loss_mask`` / ``rollout_logprobs`` as tensors.

Sharding: every (DDP rank, DataLoader worker) pair reads its own share, and together
they yield every row exactly once. A rollout belongs to shard
``shard_of(rollout_id, world_size * num_workers)`` (a stable hash), so all chains of a
rollout land on the same worker, the split needs no coordination, and it holds while
following a run in progress: the manifest lists each shard's rollout ids, so a worker
opens only shards that hold one of its rollouts, and keeps a rollout once even if a
recovery commits it again in a later shard. Rank and world size are given, or read
from ``torch.distributed`` when it is initialized, else 0 and 1.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from farm.output.shard_reader import ShardReader
from farm.trajectory.schema import Sample, table_to_samples


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def shard_of(key: str, num_shards: int) -> int:
    """The shard ``key`` belongs to: a stable hash, the same in every process and run."""
    return xxhash.xxh3_64_intdigest(key.encode()) % num_shards if num_shards > 1 else 0


def worker_shard(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(this reader's shard, number of shards) for the calling DataLoader worker of
    this rank: shard = rank * num_workers + worker id."""
    # optional extra: torch
    import torch
    from torch.utils.data import get_worker_info

    if rank is None or world_size is None:
        dist = torch.distributed
        initialized = dist.is_available() and dist.is_initialized()
        rank = (dist.get_rank() if initialized else 0) if rank is None else rank
        world_size = (dist.get_world_size() if initialized else 1) if world_size is None else world_size
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")
    info = get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return rank * workers + worker, world_size * workers


def sample_tensors(s: Sample) -> dict[str, Any]:
    """A Sample as a dict: its columns, with the token columns as tensors."""
    # optional extra: torch
    import torch

    row = s.model_dump(exclude={"tokens", "loss_mask", "rollout_logprobs", "routed_experts"})
    row["tokens"] = torch.from_numpy(s.tokens.astype("int64"))
    row["loss_mask"] = torch.from_numpy(s.loss_mask.copy())
    row["rollout_logprobs"] = torch.from_numpy(s.rollout_logprobs.copy())
    if s.routed_experts is not None:  # MoE routing replay: [len(tokens) - 1, layers, top_k]
        row["routed_experts"] = torch.from_numpy(s.routed_experts.astype("int64"))
    return row


def make_torch_dataset(reader: ShardReader, *, follow: dict[str, Any] | None = None, rank: int | None = None,
                       world_size: int | None = None) -> Any:
    """An ``IterableDataset`` over the reader's Samples, sharded over ranks and workers
    (module docstring); ``follow`` = kwargs of ``ShardReader.follow`` to stream shards
    as they land instead of a one-shot read. With DataLoader workers, ``stop`` must be
    visible from a worker process (a callable checking a file, a
    ``multiprocessing.Event``), or use ``timeout``."""
    if not torch_available():
        raise ImportError("make_torch_dataset needs torch (pip install torch); farm does not install it")
    # optional extra: torch
    from torch.utils.data import IterableDataset

    class SampleDataset(IterableDataset):  # type: ignore[misc]
        def __iter__(self) -> Iterator[dict[str, Any]]:
            shard, shards = worker_shard(rank, world_size)
            yielded: set[str] = set()
            entries = reader.follow(**follow) if follow is not None else reader.entries()
            for entry in entries:
                mine = {r for r in entry.rollout_ids if r not in yielded and shard_of(r, shards) == shard}
                if not mine:
                    continue  # nothing of this worker's in the shard: not even opened
                table = reader._read_or_skip(entry)  # on_damaged="skip" leaves a damaged shard out
                if table is None:
                    continue
                table = table.filter(pc.is_in(table.column("rollout_id"), value_set=pa.array(sorted(mine))))
                yielded |= mine
                for s in table_to_samples(table):
                    yield sample_tensors(s)

    return SampleDataset()
