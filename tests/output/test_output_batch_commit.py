"""The reducer's commit builds the Samples' Arrow table once for the whole batch
(``farm.output.writer.sample_tables``): its shards are byte for byte what a table built
per rollout gives."""

from __future__ import annotations

import pytest
from farm_helpers import make_result, reducer_config

from farm.actors.reducer import ReducerActor
from farm.output.manifest import read_manifest
from farm.output.shards import ShardWriter
from farm.trajectory.schema import SAMPLE_SCHEMA, samples_to_table


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_a_batch_commit_writes_the_shard_a_per_rollout_build_writes(tmp_path, fmt):
    cfg = reducer_config(tmp_path / "out", format=fmt)
    reducer = ReducerActor(cfg, metrics=False)
    results = []
    for i in range(11):  # rollouts without Samples, with one and with several (a sub-agent's chains)
        r = make_result(f"g{i // 4}.{i % 4}", turns=i % 4, reward=float(i % 2))
        for k in range(i % 3 if r.tree is not None else 0):  # more roots: one Sample each
            r.tree.append(parent_id=None, prompt_delta_ids=[5, 6 + k], output_ids=[200 + i, 201],
                          output_logprobs=[-0.125, -1.5], finish_reason="stop")  # fmt: skip
        results.append((r, reducer._linearize(r) if i % 5 else []))
    assert {len(s) for _, s in results} >= {0, 1, 2, 3}
    for r, samples in results:
        reducer.store.add(r, samples)
    reducer.store.commit(reducer.store.take_buffer())
    reducer.store.close()

    # the path before: one table per rollout, handed to the shard writer one by one
    per_rollout = ShardWriter(tmp_path / "per-rollout", SAMPLE_SCHEMA, name="samples", format=fmt, max_rows=1 << 62)
    for r, samples in results:
        per_rollout.write_rollout(r.rollout_id, samples_to_table(samples) if samples else SAMPLE_SCHEMA.empty_table())
    per_rollout.close()

    (got,) = read_manifest(tmp_path / "out" / "manifest.jsonl").entries
    (want,) = read_manifest(tmp_path / "per-rollout" / "manifest.jsonl").entries
    assert got.rollout_ids == want.rollout_ids == [r.rollout_id for r, _ in results]
    assert got.rows == want.rows == sum(len(s) for _, s in results) > len(results) // 2
    assert (tmp_path / "out" / got.shard).read_bytes() == (tmp_path / "per-rollout" / want.shard).read_bytes()
    assert got.checksum == want.checksum
