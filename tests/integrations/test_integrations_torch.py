"""PyTorch datasets: every row (and every group) exactly once across DataLoader workers
and DDP ranks, reading a finished run or following one that is still being written."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import numpy as np
import pytest

from farm.output import open_sample_reader
from farm.output.torch_data import make_torch_dataset, worker_shard

from integ_helpers import COMPLETE, SPECS, submit, write_config

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from farm.integrations.pytorch import make_group_dataset  # noqa: E402
from farm.output.groups import GroupsOfOneWarning  # noqa: E402


def _rows(dataset, workers: int = 2) -> Counter:
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    return Counter((row["rollout_id"], row["chain_index"]) for row in loader)


def _all_rows(run_dir) -> Counter:
    return Counter((s["rollout_id"], s["chain_index"]) for s in open_sample_reader(run_dir).read_table().to_pylist())


def test_rows_once_across_workers_and_ranks(run_dir):
    expected = _all_rows(run_dir)
    assert len(expected) == 13 and max(expected.values()) == 1  # 9 rollouts with Samples, two of 3 chains
    reader = open_sample_reader(run_dir)
    assert _rows(make_torch_dataset(reader)) == expected  # 2 workers, one process
    ranks = [_rows(make_torch_dataset(reader, rank=r, world_size=2)) for r in (0, 1)]
    assert ranks[0] + ranks[1] == expected and not set(ranks[0]) & set(ranks[1])
    # the chains of a rollout stay together (one worker of one rank)
    owner = {rid: r for r, rows in enumerate(ranks) for rid, _ in rows}
    assert all(owner[rid] == r for r, rows in enumerate(ranks) for rid, _ in rows)
    row = next(iter(make_torch_dataset(reader)))
    assert row["tokens"].dtype == torch.int64 and len(row["loss_mask"]) == row["response_length"]


def test_rank_and_world_size_from_torch_distributed(monkeypatch):
    dist = torch.distributed
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    assert worker_shard() == (1, 3)
    assert worker_shard(0, 2) == (0, 2)  # given explicitly: wins
    with pytest.raises(ValueError):
        worker_shard(2, 2)


def test_following_a_run_in_progress(tmp_path, hf_tokenizer):
    """Workers follow the manifest while more rollouts land; each row comes once."""
    write_config(tmp_path)
    asyncio.run(submit(tmp_path, hf_tokenizer, SPECS[:4]))
    done = tmp_path / "writer-done"
    writer = threading.Thread(target=lambda: (asyncio.run(submit(tmp_path, hf_tokenizer, SPECS[4:])), done.touch()))
    ds = make_torch_dataset(open_sample_reader(tmp_path), follow={"stop": done.exists, "poll_interval": 0.02})
    seen: Counter = Counter()
    for row in DataLoader(ds, batch_size=None, num_workers=2):
        if not writer.is_alive() and not done.exists():
            writer.start()  # the rest is written while the workers follow
        seen[(row["rollout_id"], row["chain_index"])] += 1
    writer.join()
    assert seen == _all_rows(tmp_path) and len(seen) == 13


def test_group_dataset_once_across_workers_and_ranks(run_dir):
    loader = DataLoader(make_group_dataset(run_dir), batch_size=None, num_workers=2)
    got = list(loader)
    assert sorted(g["group_id"] for g in got) == COMPLETE  # each once; t2 lost a rollout to infrastructure
    items = {g["group_id"]: g for g in got}
    t3 = items["t3"]
    assert t3["rollout_id"] == ["t3.0"] * 3 + ["t3.1"] and t3["chain_index"].tolist() == [0, 1, 2, 0]
    # each chain of t3.0 gets its rollout's advantage, over the group's two rollouts
    assert t3["advantage"].tolist() == pytest.approx([0.5 / (np.std([1.0, 0.0], ddof=1) + 1e-6)] * 3 + [
        -0.5 / (np.std([1.0, 0.0], ddof=1) + 1e-6)])
    assert len(t3["tokens"]) == 4 and len(t3["loss_mask"][2]) == len(t3["tokens"][2]) - t3["prompt_length"][2]
    ranks = [[g["group_id"] for g in make_group_dataset(run_dir, rank=r, world_size=2)] for r in (0, 1)]
    assert sorted(ranks[0] + ranks[1]) == COMPLETE
    with pytest.warns(GroupsOfOneWarning, match="is 0 for every rollout"):  # asked for groups of one
        make_group_dataset(run_dir, size=1)
