"""OutputReader: the one way an output directory is read (report, inspect, export, verify,
the run summary). Each table comes out in the current shape, whatever version wrote its
shards; the run files read as {} / None when absent."""

from __future__ import annotations

import json

import pytest
import yaml
from formats_helpers import write_run
from test_output_formats_schema import V2_ONLY, write_v1

from farm.output import OutputReader
from farm.output.rows import ROLLOUT_SCHEMA
from farm.run.summary import directory_summary


def test_every_table_and_run_file_reads_through_one_reader(tmp_path):
    out = tmp_path / "run"
    reader = OutputReader(out)
    assert (reader.rollout_rows(), reader.run_config(), reader.summary()) == ([], {}, None)
    _, rows = write_run(out, "arrow", [["a0.0", "a0.1"]])
    (out / "run_config.yaml").write_text(yaml.safe_dump({"rollout": {"n_samples": 2}}))
    (out / "summary.json").write_text(json.dumps({"planned": 2}))
    got = reader.rollout_rows(["rollout_id", "status", "num_samples"])
    assert got == [{k: r[k] for k in ("rollout_id", "status", "num_samples")} for r in rows]
    assert reader.table("samples").rollout_ids() == reader.samples().rollout_ids() == {"a0.0", "a0.1"}
    assert reader.table("rollouts").rollout_ids() == {"a0.0", "a0.1"}
    assert (reader.run_config(), reader.summary()) == ({"rollout": {"n_samples": 2}}, {"planned": 2})
    with pytest.raises(ValueError, match="no table 'nope'"):
        reader.table("nope")


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_rollout_rows_of_an_older_farm_read_beside_new_ones(tmp_path, fmt):
    """A rollouts shard written before the v2 columns, between two current ones: every
    reader of the table (the run summary too) sees one table in the current columns."""
    write_run(tmp_path, fmt, [["a0.0"]])
    write_v1(tmp_path, fmt)
    write_run(tmp_path, fmt, [["b0.0"]], group_base=5)
    reader = OutputReader(tmp_path)
    rows = reader.rollout_rows()
    assert [r["rollout_id"] for r in rows] == ["a0.0", "old.0", "b0.0"]
    assert list(rows[1]) == ROLLOUT_SCHEMA.names and all(rows[1][c] is None for c in V2_ONLY)
    rollouts = reader.rollouts()  # shard by shard too (the report, inspect and export read so)
    for entry in rollouts.entries():
        assert rollouts.read_shard(entry).schema.names == ROLLOUT_SCHEMA.names
    assert directory_summary(tmp_path).rollouts == 3
