"""Sample schema versions: a version-1 shard (``policy_version`` where version 2 has
``group_index`` and ``policy_version_min``/``_max``) in the same directory as version-2
shards is read in the current shape; ``farm export`` writes the current version."""

from __future__ import annotations

import glob

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from farm.cli import main as farm_main
from farm.output.rows import ROLLOUT_SCHEMA
from farm.trajectory import table_to_samples
from farm.output import ShardReader, ShardWriter, open_sample_reader
from farm.trajectory.schema import SAMPLE_SCHEMA, SCHEMA_VERSION
from farm.output.verify import verify_dir

from formats_helpers import assert_rows_are_samples, make_result, samples_of, v1_schema, v1_table, write_run

V2_ONLY = ("group_index", "policy_version_min", "policy_version_max")
ROLLOUTS_V1 = pa.schema([f for f in ROLLOUT_SCHEMA if f.name not in (*V2_ONLY, "policy_version_at_finish")])


def write_v1(out, fmt, rid="old.0", policy_version=7):
    """What the previous farm wrote for one rollout: a v1 Samples shard and a rollouts
    row without the v2 columns, through the same writer."""
    result = make_result(rid, 0, policy_version=policy_version, branch=True)
    samples = samples_of(result)
    with ShardWriter(out, v1_schema(), format=fmt) as w:
        w.write_rollout(rid, v1_table(samples))
    row = result.row(num_samples=len(samples)).model_dump()
    with ShardWriter(out, ROLLOUTS_V1, name="rollouts", format=fmt) as w:
        w.write_rollout(rid, [{k: row[k] for k in ROLLOUTS_V1.names}])
    return samples


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_a_v1_shard_beside_v2_shards_is_read_in_the_current_shape(tmp_path, fmt):
    new, _ = write_run(tmp_path, fmt, [["a0.0"]])  # v2 shard, then a v1 one, then v2 again
    old = write_v1(tmp_path, fmt)
    newer, _ = write_run(tmp_path, fmt, [["b0.0", "b0.1"]], group_base=5)
    reader = open_sample_reader(tmp_path)
    versions = [pq.read_schema(tmp_path / e.shard) if fmt == "parquet" else
                pa.ipc.open_file(tmp_path / e.shard).schema for e in reader.entries()]  # fmt: skip
    assert [s.metadata[b"farm.schema_version"] for s in versions] == [b"2", b"1", b"2"]
    assert "policy_version" in versions[1].names and "group_index" not in versions[1].names
    v1_shard = reader.read_shard(reader.entries()[1])
    assert set(V2_ONLY) <= set(v1_shard.column_names) and "policy_version" not in v1_shard.column_names
    got = table_to_samples(reader.read_table())
    assert [s.rollout_id for s in got] == [s.rollout_id for s in new + old + newer]
    for s, want in zip([s for s in got if s.rollout_id == "old.0"], old, strict=True):
        assert (s.policy_version_min, s.policy_version_max, s.group_index) == (want.policy_version_min,) * 2 + (None,)
        assert s.tokens.tolist() == want.tokens.tolist()
        assert s.rollout_logprobs.tolist() == want.rollout_logprobs.tolist()
    # what v2 would have said; v1 kept only the minimum
    assert [(s.policy_version_min, s.policy_version_max) for s in old] == [(7, 9), (16, 16)]
    v2 = [(s.group_index, s.policy_version_min, s.policy_version_max) for s in got if s.rollout_id != "old.0"]
    assert v2 == [(s.group_index, s.policy_version_min, s.policy_version_max) for s in new + newer]


def test_export_writes_the_current_version(tmp_path, capsys):
    pl = pytest.importorskip("polars")
    run, out = tmp_path / "run", tmp_path / "out"
    old = write_v1(run, "parquet")
    new, rows = write_run(run, "parquet")
    with pytest.raises(pl.exceptions.SchemaError):  # the run's own files hold two schema versions
        pl.read_parquet(f"{run}/samples/*.parquet")
    assert farm_main(["export", str(run), "-o", str(out)]) == 0
    for f in glob.glob(f"{out}/samples/*.parquet"):
        schema = pq.read_schema(f)
        assert schema.metadata[b"farm.schema_version"] == str(SCHEMA_VERSION).encode()
        assert schema.equals(SAMPLE_SCHEMA)  # types, names, nullability (Parquet names list items "element")
    for f in glob.glob(f"{out}/rollouts/*.parquet"):
        assert pq.read_schema(f).names == ROLLOUT_SCHEMA.names
    df = pl.read_parquet(f"{out}/samples/*.parquet")
    upgraded = [s.model_copy(update={"policy_version_max": s.policy_version_min, "group_index": None}) for s in old]
    assert_rows_are_samples(df.to_dicts(), upgraded + new)
    rollouts = {r["rollout_id"]: r for r in pl.read_parquet(f"{out}/rollouts/*.parquet").to_dicts()}
    assert {k: rollouts["old.0"][k] for k in (*V2_ONLY, "policy_version_at_finish")} == dict.fromkeys(
        (*V2_ONLY, "policy_version_at_finish"))
    assert rollouts["t0.0"]["policy_version_min"] == rows[0]["policy_version_min"] is not None
    assert verify_dir(out).problems == []
    assert len(ShardReader(out, name="rollouts").read_table()) == len(rows) + 1
