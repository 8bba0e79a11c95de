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


@pytest.mark.parametrize(("max_rows", "want"), [
    (5, [(["r1", "r0"], 4), (["r2", "r3"], 4), (["r4", "r5"], 4)]),  # past the limits
    (100, [(["r1", "r0", "r2", "r3", "r4", "r5"], 12)]),  # within them
])  # fmt: skip
def test_writing_rollouts_at_once_seals_and_skips_as_one_by_one(tmp_path, max_rows, want):
    """Past a shard's limits, or with a rollout already written, ``write_rollouts`` does
    what ``write_rollout`` per rollout does: the same shards, the same ids in each."""
    rows = [{"rollout_id": f"r{i // 2}", "x": i} for i in range(12)]  # 6 rollouts of 2 rows
    counts = [(f"r{k}", 2) for k in range(6)]
    import pyarrow as pa

    schema = pa.schema([("rollout_id", pa.string()), ("x", pa.int64())])
    table = pa.Table.from_pylist(rows, schema=schema)
    shards = {}
    for how in ("at-once", "one-by-one"):
        w = ShardWriter(tmp_path / how, schema, name="t", max_rows=max_rows)
        w.write_rollout("r1", table.slice(2, 2))  # already pending: left out
        if how == "at-once":
            assert w.write_rollouts(counts, table)
        else:
            for k, (rid, n) in enumerate(counts):
                w.write_rollout(rid, table.slice(2 * k, n))
        w.close()
        shards[how] = [(e.rollout_ids, e.rows) for e in read_manifest(tmp_path / how / "t.manifest.jsonl").entries]
    assert shards["at-once"] == shards["one-by-one"] == want
