"""What a table's rows add up to, kept in its manifest checkpoint (farm.output.tally): the
run's end and `farm inspect` read the checkpoint's counts and the rows after it, and get
what folding every row gives; a checkpoint without usable counts (another group size,
sample indexes past it) means every row is read, with the same answer."""

from __future__ import annotations

import math

import pytest
import yaml

import farm.output.writer as writer_mod
from farm.output.config import OutputConfig
from farm.output.fidelity import directory_fidelity, fidelity_totals, measured_samples
from farm.output.reader import OutputReader
from farm.output.rows import counts_of
from farm.output.shard_reader import ShardReader
from farm.output.writer import OutputWriter
from farm.rollout.model import RolloutResult
from farm.run.summary import cumulative, directory_summary
from farm.status import RolloutStatus
from farm.trajectory import RolloutInfo, TurnTree, linearize

STATUSES = [RolloutStatus.COMPLETED, RolloutStatus.COMPLETED, RolloutStatus.SANDBOX_ERROR, RolloutStatus.TRUNCATED,
            RolloutStatus.COMPLETED, RolloutStatus.TIMEOUT, RolloutStatus.COMPLETED]  # fmt: skip
REWARDS = [0.1, 0.1, 0.25, 1.0, 0.7, 0.0, 0.1]  # summed naively: 12.099999999999994, exactly: 12.1


def _result(i: int, size: int) -> tuple[RolloutResult, list]:
    gid, k = f"g{i // size}", i % size
    status = STATUSES[i % len(STATUSES)]
    tree = TurnTree(f"s{i}")
    tree.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[7, 8, 9][: 1 + i % 3],
                output_logprobs=[-0.1] * (1 + i % 3), finish_reason="stop")  # fmt: skip
    grading = {"flags": ["runtime:network"] if i % 5 == 0 else [], "hack_action": "zero_reward" if i % 9 == 0 else None}
    result = RolloutResult(run_id="r", rollout_id=f"{gid}.{k}", group_id=gid, task_id=gid, sample_index=k, harness="h",
                           status=status, reward=REWARDS[i % len(REWARDS)], attempt=1 + (i % 4 == 0),
                           grading=grading, tree=tree if status.trainable else None,
                           counts=counts_of(tree) if status.trainable else counts_of(None))  # fmt: skip
    samples = linearize(tree, RolloutInfo(rollout_id=result.rollout_id, reward=result.reward)) if status.trainable else []
    for s in samples[: i % 2]:  # every other trainable rollout's Sample carries a fidelity record
        s.metadata["fidelity"] = {"seen_tokens": 10 + i, "differing_tokens": i % 3, "model_output": i % 3,
                                  "tool_result": 0, "template": 0, "special_tokens_in_content": i % 2}  # fmt: skip
    return result, samples


def _directory(out, monkeypatch, *, n: int, size: int = 4) -> None:
    """``n`` rollouts in groups of ``size``, one commit each, checkpoints every 5 lines; the
    writer dies after the last commit (no checkpoint at close): rows after the last one."""
    monkeypatch.setattr(writer_mod, "CHECKPOINT_MIN_LINES", 5)
    out.mkdir()
    (out / "run_config.yaml").write_text(yaml.safe_dump({"rollout": {"n_samples": size}}))
    store = OutputWriter(out, OutputConfig(dir=str(out)))
    store.recover()
    store.reconcile()
    for i in range(n):
        store.add(*_result(i, size))
        store.commit(store.take_buffer())
    store.samples.close()
    store.rollouts.close()


@pytest.fixture
def shards_read(monkeypatch):
    read: list[str] = []
    real = ShardReader.read_shard

    def spy(self, entry, *a, **kw):
        read.append(entry.shard)
        return real(self, entry, *a, **kw)

    monkeypatch.setattr(ShardReader, "read_shard", spy)
    return read


def test_counts_from_the_checkpoint_and_the_tail_equal_the_counts_over_every_row(tmp_path, monkeypatch, shards_read):
    out = tmp_path / "out"
    _directory(out, monkeypatch, n=43)
    rows = OutputReader(out).rollout_rows()
    want = cumulative(rows, 0, group_size=4)
    assert want.rollouts == 43 and want.groups == 11 and 0 < want.groups_incomplete < 11 and want.grading_flags
    shards_read.clear()
    got = directory_summary(out, group_size=4)
    assert got == want
    policy = [r["reward"] for r in rows if RolloutStatus(r["status"]).trainable]
    assert got.mean_reward == math.fsum(policy) / len(policy) != sum(policy) / len(policy)
    assert len(shards_read) == 3  # the rows after the last checkpoint (40 lines), not the 43
    shards_read.clear()
    fid = directory_fidelity(out).totals()
    assert len(shards_read) == 3
    assert fid == fidelity_totals(measured_samples(out)) and fid["samples_measured"] > 0


def test_counts_for_another_group_size_read_every_row(tmp_path, monkeypatch, shards_read):
    out = tmp_path / "out"
    _directory(out, monkeypatch, n=22)
    rows = OutputReader(out).rollout_rows()
    for size in (3, 8):  # 3: sample indexes past the size (every group kept); 8: groups not complete yet
        shards_read.clear()
        assert directory_summary(out, group_size=size) == cumulative(rows, 0, group_size=size)
        assert len(shards_read) >= 22


def test_a_resumed_writer_carries_the_counts_on(tmp_path, monkeypatch):
    """A writer opened from a checkpoint folds the rows after it into the checkpoint's
    counts; after a retraction (the manifest rewritten) it folds every row again."""
    out = tmp_path / "out"
    _directory(out, monkeypatch, n=17)
    store = OutputWriter(out, OutputConfig(dir=str(out)))
    store.recover()
    store.reconcile()
    assert store.group_size == 4 and store.rollouts.from_checkpoint
    for i in range(17, 30):
        store.add(*_result(i, 4))
        store.commit(store.take_buffer())
    store.checkpoint()
    assert store.rollouts.checkpoint_counts["rollouts"] == 30
    rows = OutputReader(out).rollout_rows()
    assert directory_summary(out, group_size=4) == cumulative(rows, 0, group_size=4)
    store.rollouts.retract(["g1.1"])
    store.samples.retract(["g1.1"])
    store.close()
    rows = OutputReader(out).rollout_rows()
    assert len(rows) == 29
    assert directory_summary(out, group_size=4) == cumulative(rows, 0, group_size=4)
    assert directory_fidelity(out).totals() == fidelity_totals(measured_samples(out))


def test_inspect_reads_only_the_rows_after_the_checkpoint(tmp_path, monkeypatch, shards_read, capsys):
    import json

    from farm.cli import main

    out = tmp_path / "out"
    _directory(out, monkeypatch, n=43)
    rows = OutputReader(out).rollout_rows()
    shards_read.clear()
    assert main(["inspect", str(out), "--no-sample"]) == 0
    assert len(shards_read) == 3  # the overview: the rollouts checkpoint's counts, then 3 shards
    text = capsys.readouterr().out
    overview = json.loads(text[text.index("{") : text.index("\n}\n") + 2])
    want = cumulative(rows, 0, group_size=4).model_dump()
    assert sum(r["turns"] for r in rows) > 0 and sum(r["output_tokens"] for r in rows) > 43
    assert overview == {**want, "turns": sum(r["turns"] for r in rows),
                        "output_tokens": sum(r["output_tokens"] for r in rows)}  # fmt: skip
