"""``farm export``: an Arrow-IPC run's committed tables as Parquet that plain readers glob,
each rollout once, checksums verified, atomically written, resumable; damage and its own
run directory refused."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from farm.cli import main as farm_main
from farm.output import committed_files
from farm.output.manifest import read_manifest
from farm.output.verify import verify_dir

from formats_helpers import assert_rows_are_rollouts, assert_rows_are_samples, write_run


def export(*args: str) -> int:
    return farm_main(["export", *map(str, args)])


def test_an_arrow_run_exports_to_parquet_that_plain_readers_glob(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    pl = pytest.importorskip("polars")
    run, out = tmp_path / "run", tmp_path / "out"
    samples, rows = write_run(run, "arrow")
    assert export(run, "-o", out) == 0
    printed = capsys.readouterr().out
    assert f"samples: {len(samples)} rows of 5 rollouts in 1 parquet shard(s) (5 rollouts added)" in printed
    files = sorted(glob.glob(f"{out}/samples/*.parquet"))
    assert files == committed_files(out) and not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    ds = datasets.load_dataset("parquet", data_files=f"{out}/samples/*.parquet", split="train",
                               cache_dir=str(tmp_path / "hf"))  # fmt: skip
    assert_rows_are_samples(list(ds), samples)
    assert_rows_are_rollouts(pl.read_parquet(f"{out}/rollouts/*.parquet").to_dicts(), rows)
    marker = json.loads((out / "export.json").read_text())
    assert marker["complete"] and marker["source"] == str(run.resolve()) and marker["schema_version"] == 2
    assert marker["tables"]["samples"] == {"shards": 1, "rows": len(samples), "rollouts": 5, "added": 5,
                                           "duplicates_dropped": 0}  # fmt: skip
    assert verify_dir(out).problems == []
    # again: nothing to add; after the run went on: only the new rollout
    assert export(run, "-o", out) == 0
    printed = capsys.readouterr().out
    assert "(0 rollouts added)" in printed and "listed twice" not in printed
    more, more_rows = write_run(run, "arrow", [["t3.0"]], group_base=3)
    assert export(run, "-o", out, "--table", "samples") == 0
    assert "samples: 7 rows of 6 rollouts in 2 parquet shard(s) (1 rollouts added)" in capsys.readouterr().out
    assert set(json.loads((out / "export.json").read_text())["tables"]) == {"samples", "rollouts"}
    assert_rows_are_samples(pl.read_parquet(f"{out}/samples/*.parquet").to_dicts(), samples + more)


def test_a_rollout_listed_by_two_shards_is_exported_once(tmp_path, capsys):
    pl = pytest.importorskip("polars")
    run, other, out = tmp_path / "run", tmp_path / "other", tmp_path / "out"
    samples, rows = write_run(run, "arrow")
    # a second shard also holding t0.0 (run again with other weights), plus x0.0
    again, again_rows = write_run(other, "arrow", [["t0.0", "x0.0"]], policy_version=40)
    for manifest in ("manifest.jsonl", "rollouts.manifest.jsonl"):
        for e in read_manifest(other / manifest).entries:
            shutil.copy(other / e.shard, run / e.shard)
            with open(run / manifest, "ab") as fh:
                fh.write((e.model_dump_json() + "\n").encode())
    assert export(run, "-o", out) == 0
    printed = capsys.readouterr().out
    assert printed.count("1 rollout(s) listed twice in the run kept once") == 2
    x0 = [s for s in again if s.rollout_id == "x0.0"]
    assert_rows_are_samples(pl.read_parquet(f"{out}/samples/*.parquet").to_dicts(), samples + x0)  # first wins
    assert_rows_are_rollouts(pl.read_parquet(f"{out}/rollouts/*.parquet").to_dicts(), rows + again_rows[1:])
    marker = json.loads((out / "export.json").read_text())
    assert marker["tables"]["samples"]["rollouts"] == 6 and marker["tables"]["samples"]["duplicates_dropped"] == 1
    assert verify_dir(out).problems == []


@pytest.mark.parametrize("damage", ["flipped byte", "missing"])
def test_a_damaged_shard_is_refused_and_nothing_written(tmp_path, capsys, damage):
    run, out = tmp_path / "run", tmp_path / "out"
    write_run(run, "arrow")
    shard = read_manifest(run / "rollouts.manifest.jsonl").entries[1].shard
    if damage == "missing":
        (run / shard).unlink()
    else:
        data = bytearray((run / shard).read_bytes())
        data[len(data) // 3] ^= 0x01
        (run / shard).write_bytes(bytes(data))
    assert export(run, "-o", out) == 1
    err = capsys.readouterr().err
    assert err.startswith("farm export: ") and shard in err
    assert ("damaged shard: checksum" if damage != "missing" else "but missing") in err
    assert not out.exists()


def test_the_run_directory_itself_or_a_foreign_directory_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, "arrow", [["t0.0"]])
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    os.symlink(run, tmp_path / "link")
    for out in (run, f"{run}/.", tmp_path / "link", run / "exported"):
        assert export(run, "-o", out) == 2
        assert "is the run directory or inside it" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert export(run, "-o", foreign) == 2 and "is not empty" in capsys.readouterr().err
    assert export(run, "-o", tmp_path / "out") == 0
    assert export(run, "-o", tmp_path / "out", "--format", "arrow") == 2  # not the same kind of export
    assert export(tmp_path / "out", "-o", tmp_path / "out2", "--table", "rollouts") == 0  # an export exports
