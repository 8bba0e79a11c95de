"""An output directory written with ``output.format=parquet`` (through OutputWriter, the
reducer's writer) is read row for row and token for token by HF ``datasets``, polars,
DuckDB and Ray Data, given the committed file list (``committed_files``) or, for a
finished run, a plain glob."""

from __future__ import annotations

import glob
import shutil

import pyarrow.parquet as pq
import pytest

from farm.errors import ShardError
from farm.output import committed_files, open_sample_reader
from farm.output.manifest import read_manifest

from formats_helpers import LIST_DTYPES, LIST_TYPES, assert_rows_are_rollouts, assert_rows_are_samples, write_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished parquet run, then the debris a crash or a live run leaves beside the
    committed shards: a sealed shard no manifest line lists yet, a temp file, and a
    quarantined shard."""
    out = tmp_path_factory.mktemp("parquet-run")
    samples, rows = write_run(out, "parquet")
    clean = sorted(glob.glob(f"{out}/samples/*.parquet"))
    other = tmp_path_factory.mktemp("other-run")
    write_run(other, "parquet", [["z9.0"]])
    stray = next((other / "samples").glob("*.parquet"))
    shutil.copy(stray, out / "samples" / stray.name)
    shutil.copy(stray, out / "samples" / f".{stray.name}.tmp")
    (out / "quarantine" / "samples").mkdir(parents=True)
    shutil.copy(stray, out / "quarantine" / "samples" / stray.name)
    return out, samples, rows, clean


def test_committed_files_select_exactly_the_manifest_shards(run):
    out, samples, _, clean = run
    files = committed_files(out)
    listed = [str(out / e.shard) for e in read_manifest(out / "manifest.jsonl").entries]
    assert files == listed and sorted(files) == clean
    # a glob would also take the unlisted shard (which a recovery may still quarantine)
    assert len(glob.glob(f"{out}/samples/*.parquet")) == len(files) + 1
    # the run's shards carry the schema and its version in the Parquet footer
    for f in files:
        schema = pq.read_schema(f)
        assert schema.metadata[b"farm.schema_version"] == b"2" and schema.metadata[b"farm.table"] == b"samples"
    # the shard of the failure-only commit has no row group: HF datasets reads it (one
    # empty row group made its loader fail: batch size = that group's 0 rows)
    empty = [pq.ParquetFile(f).metadata for f in files if pq.ParquetFile(f).metadata.num_rows == 0]
    assert [m.num_row_groups for m in empty] == [0]
    assert_rows_are_samples(open_sample_reader(out).read_table().to_pylist(), samples)


def test_committed_files_verify_checksums_and_single_listing(tmp_path):
    write_run(tmp_path, "parquet")
    first = read_manifest(tmp_path / "manifest.jsonl").entries[0]
    path = tmp_path / first.shard
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="damaged"):
        committed_files(tmp_path)
    assert len(committed_files(tmp_path, verify=False)) == 3
    # a rollout listed by two shards would be read twice by a plain-file reader
    line = read_manifest(tmp_path / "rollouts.manifest.jsonl").entries[0]
    with open(tmp_path / "rollouts.manifest.jsonl", "ab") as fh:
        fh.write((line.model_copy(update={"shard": "rollouts/copy.parquet"}).model_dump_json() + "\n").encode())
    shutil.copy(tmp_path / line.shard, tmp_path / "rollouts" / "copy.parquet")
    with pytest.raises(ShardError, match="'t0.0' is listed by rollouts/rollouts-000000-.*and rollouts/copy.parquet"):
        committed_files(tmp_path, "rollouts")


def test_hf_datasets_reads_the_samples(run, tmp_path):
    datasets = pytest.importorskip("datasets")
    out, samples, _, clean = run
    for data_files in (committed_files(out), clean):
        ds = datasets.load_dataset("parquet", data_files=data_files, split="train", cache_dir=str(tmp_path / "hf"))
        for name, t in LIST_TYPES.items():
            assert ds.data.schema.field(name).type == t
        assert_rows_are_samples(list(ds), samples)
        # the features keep the stored types (HF's numpy/torch formats widen integers to
        # int64 by their own default)
        assert {n: ds.features[n].feature.dtype for n in LIST_DTYPES} == {
            "tokens": "int32", "loss_mask": "uint8", "rollout_logprobs": "float32"}


def test_polars_reads_both_tables(run):
    pl = pytest.importorskip("polars")
    out, samples, rows, _ = run
    df = pl.read_parquet(committed_files(out))
    assert (df.schema["tokens"], df.schema["loss_mask"], df.schema["rollout_logprobs"]) == (
        pl.List(pl.Int32), pl.List(pl.UInt8), pl.List(pl.Float32))
    assert_rows_are_samples(df.to_dicts(), samples)
    lazy = pl.scan_parquet(committed_files(out)).filter(pl.col("chain_kind") == "main").select("rollout_id")
    assert sorted(lazy.collect()["rollout_id"].to_list()) == ["t0.0", "t0.1", "t1.0"]
    assert_rows_are_rollouts(pl.read_parquet(committed_files(out, "rollouts")).to_dicts(), rows)


def test_duckdb_reads_the_samples(run):
    duckdb = pytest.importorskip("duckdb")
    out, samples, _, _ = run
    con = duckdb.connect()
    files = committed_files(out)
    rel = con.execute("SELECT * FROM read_parquet(?)", [files])
    names = [d[0] for d in rel.description]
    assert_rows_are_samples([dict(zip(names, r)) for r in rel.fetchall()], samples)
    types = con.execute("SELECT DISTINCT typeof(tokens), typeof(loss_mask), typeof(rollout_logprobs), "
                        "typeof(group_index) FROM read_parquet(?)", [files]).fetchall()  # fmt: skip
    assert types == [("INTEGER[]", "UTINYINT[]", "FLOAT[]", "BIGINT")]
    trained, note = con.execute("SELECT sum(list_sum(loss_mask)), any_value(json_extract_string(metadata, "
                                "'$.unicode')) FROM read_parquet(?)", [files]).fetchone()  # fmt: skip
    assert trained == sum(s.num_trained_tokens for s in samples) and note == "ünïcödé ✓ 🚀"


@pytest.mark.slow
def test_ray_data_reads_the_samples(run, shared_ray):
    """On the session's shared local Ray (tests/conftest.py): a Ray of its own cost a start
    and a shutdown for a few reads."""
    pytest.importorskip("ray")
    pytest.importorskip("pandas")  # ray.data imports it: users need ray[data]
    out, samples, rows, clean = run
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.read_parquet(committed_files(out))
    schema = ds.schema().base_schema
    assert all(schema.field(n).type == t for n, t in LIST_TYPES.items())
    assert_rows_are_samples(ds.take_all(), samples)
    # a finished run's table directory reads the same (Ray skips dot-files such as temp files)
    assert ray.data.read_parquet(str(out / "rollouts")).count() == len(rows)
    assert ray.data.read_parquet(clean).count() == len(samples)

