"""Output that survives damage: adopted shards, quarantine (never deletion), checksums on
every read by default, retraction, the two tables in agreement, ``farm verify``."""

from __future__ import annotations

import json
import threading

import numpy as np
import pyarrow as pa
import pytest

from farm.cli import main as farm_main
from farm.errors import ShardError
from farm.rollout.model import RolloutResult
from farm.output.writer import ROLLOUTS_TABLE, OutputWriter
from farm.status import RolloutStatus
from farm.output import ShardReader, ShardWriter, open_sample_reader
from farm.output.config import OutputConfig

KV = pa.schema([("rollout_id", pa.string()), ("value", pa.int64())])


def kv(rid: str, n: int = 2) -> list[dict]:
    return [{"rollout_id": rid, "value": i} for i in range(n)]


def _write(tmp_path, ids, **kw) -> list[str]:
    with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True, **kw) as w:
        for rid in ids:
            w.write_rollout(rid, kv(rid))
        return [e.shard for e in w.entries]


def _flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_shard_whose_manifest_line_was_torn_is_adopted_not_deleted(tmp_path):
    shards = _write(tmp_path, ["a", "b", "c"])
    manifest = tmp_path / "kv.manifest.jsonl"
    raw = manifest.read_bytes()
    manifest.write_bytes(raw[: raw.rindex(b"\n", 0, len(raw) - 1) + 1 + 25])  # the last line torn mid-write
    with ShardWriter(tmp_path, KV, name="kv") as w:
        assert w.recovery.truncated_manifest_tail and w.recovery.adopted == [shards[2]]
        assert w.durable_ids == {"a", "b", "c"} and not w.recovery.lost_rollouts
        assert "adopted 1 unlisted shard" in w.recovery.line("kv")
    rows = ShardReader(tmp_path, name="kv").read_table().column("rollout_id").to_pylist()
    assert sorted(rows) == ["a", "a", "b", "b", "c", "c"]
    assert json.loads(manifest.read_text().splitlines()[-1])["adopted"] is True


def test_an_unlisted_file_that_is_not_a_good_shard_is_quarantined(tmp_path):
    _write(tmp_path, ["a"])
    junk = tmp_path / "kv" / "kv-000007-0badf00d.arrow"
    junk.write_bytes(b"not arrow at all")
    other = tmp_path / "kv" / "kv-000008-0badf00e.arrow"
    pa.ipc.new_file(str(other), pa.schema([("x", pa.int8())])).close()  # a real shard of another schema
    with ShardWriter(tmp_path, KV, name="kv") as w:
        assert sorted(w.recovery.quarantined) == ["quarantine/kv/" + junk.name, "quarantine/kv/" + other.name]
        assert w.durable_ids == {"a"}
    assert (tmp_path / "quarantine" / "kv" / junk.name).read_bytes() == b"not arrow at all"


def test_damaged_bytes_are_caught_by_default_on_every_read_path(tmp_path):
    shards = _write(tmp_path, ["a", "b", "c"])
    _flip(tmp_path / shards[1])
    reader = ShardReader(tmp_path, name="kv")  # no verify=True needed: the default
    with pytest.raises(ShardError, match=f"{shards[1]}: damaged shard: checksum xxh3_128:[0-9a-f]+ != manifest "):
        reader.read_table()
    with pytest.raises(ShardError, match="damaged"):
        list(reader.iter_batches())
    skipping = ShardReader(tmp_path, name="kv", on_damaged="skip")
    assert sorted(set(skipping.read_table().column("rollout_id").to_pylist())) == ["a", "c"]
    assert [e.shard for e, _ in skipping.skipped] == [shards[1]]
    # a resume keeps only what verifies: the damaged file is quarantined, its rollout runs again
    with ShardWriter(tmp_path, KV, name="kv") as w:
        assert w.recovery.lost_rollouts == ["b"] and w.recovery.quarantined == ["quarantine/" + shards[1]]
        assert w.durable_ids == {"a", "c"}
        w.write_rollout("b", kv("b"))
    assert sorted(ShardReader(tmp_path, name="kv").read_table().column("rollout_id").to_pylist()) == [
        "a", "a", "b", "b", "c", "c"]  # fmt: skip


def test_retract_rewrites_and_quarantines(tmp_path):
    with ShardWriter(tmp_path, KV, name="kv") as w:
        for rid in "abc":
            w.write_rollout(rid, kv(rid))
        w.flush()
        (old,) = [e.shard for e in w.entries]
        moved = w.retract(["b"])
        assert w.durable_ids == {"a", "c"} and len(moved) == 1 and not (tmp_path / old).exists()
        assert w.write_rollout("b", kv("b", 3))  # no longer durable: can be written again
    table = ShardReader(tmp_path, name="kv").read_table()
    assert sorted(table.column("rollout_id").to_pylist()) == ["a", "a", "b", "b", "b", "c", "c"]
    assert (tmp_path / "quarantine" / old).is_file()


def test_following_a_run_never_yields_a_rollout_twice(tmp_path):
    shards = _write(tmp_path, ["a", "b"])
    reader = ShardReader(tmp_path, name="kv")
    stop = threading.Event()
    batches = reader.follow_batches(poll_interval=0.02, stop=stop)
    seen = [next(batches), next(batches)]
    # shard b is lost; the resumed run writes b again; a recovery re-adopts a copy of a
    (tmp_path / shards[1]).unlink()
    with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
        w.write_rollout("b", kv("b"))
        w.write_rollout("c", kv("c"))
    stop.set()
    seen += list(batches)
    ids = [rid for b in seen for rid in b.column("rollout_id").to_pylist()]
    assert sorted(ids) == ["a", "a", "b", "b", "c", "c"]


def _result(rid: str, status: RolloutStatus = RolloutStatus.COMPLETED) -> RolloutResult:
    return RolloutResult(run_id="r", rollout_id=rid, group_id=rid, task_id=rid, sample_index=0, harness="h",
                         status=status, reward=1.0)  # fmt: skip


def _store_with(tmp_path, rids) -> None:
    from farm.trajectory import RolloutInfo, TurnTree, linearize

    store = OutputWriter(tmp_path, OutputConfig(dir=str(tmp_path)))
    for rid in rids:
        tree = TurnTree(f"s-{rid}")
        tree.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[7, 8], output_logprobs=[-0.1, -0.2],
                    finish_reason="stop")  # fmt: skip
        store.add(_result(rid), linearize(tree, RolloutInfo(rollout_id=rid, reward=1.0)))
        store.commit(store.take_buffer())  # one commit (one shard per table) per rollout
    store.close()


def test_the_two_tables_agree_after_a_samples_shard_is_lost(tmp_path, capsys):
    _store_with(tmp_path, ["t1", "t2", "t3"])
    entries = ShardReader(tmp_path, name="samples").entries()
    (tmp_path / entries[1].shard).unlink()  # t2's Samples gone
    assert farm_main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{entries[1].shard}: missing" in out and "t2: row promises 1 Samples, 0 committed" in out
    store = OutputWriter(tmp_path, OutputConfig(dir=str(tmp_path)))
    assert store.reconcile() == ["t2"] and set(store.summaries) == {"t1", "t3"}  # t2 runs again
    assert any("1 rollout(s) whose Samples were lost run again (t2)" in line for line in store.recovery_lines())
    store.close()
    rows = ShardReader(tmp_path, name=ROLLOUTS_TABLE).read_table().column("rollout_id").to_pylist()
    assert sorted(rows) == ["t1", "t3"]
    capsys.readouterr()
    assert farm_main(["verify", str(tmp_path)]) == 0
    # each table's rows counted apart (a Sample is not a rollout), never one summed "rows"
    assert "shards checked (2 Samples, 2 rollout rows), 0 problem(s)" in capsys.readouterr().out


def test_farm_verify_repair_adopts_quarantines_and_rebuilds(tmp_path, capsys):
    _store_with(tmp_path, ["t1", "t2", "t3"])
    samples = ShardReader(tmp_path, name="samples").entries()
    _flip(tmp_path / samples[0].shard)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_bytes(manifest.read_bytes()[:-30])  # t3's line torn
    assert farm_main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "damaged shard" in out and "torn last line" in out and "no manifest line lists it" in out
    assert farm_main(["verify", "--repair", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "adopted 1 unlisted shard" in out and "quarantined 1" in out and "run again (t1)" in out
    assert sorted(open_sample_reader(tmp_path).read_table().column("rollout_id").to_pylist()) == ["t2", "t3"]
    assert (tmp_path / "quarantine" / samples[0].shard).is_file()


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_a_checksum_of_pieces_is_the_checksum_of_the_bytes(algorithm):
    """StreamChecksum (the shard writer's, hashing in a thread as pieces are written) gives
    what ``checksum`` gives for the pieces joined: large and tiny pieces, empty ones, in order."""
    from farm.output.integrity import StreamChecksum, checksum

    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 7, 4096, 0, 3 << 20, 5, 9 << 20)]
    digest = StreamChecksum(algorithm)
    for p in pieces:
        digest.update(memoryview(p))
    assert digest.hexdigest() == checksum(b"".join(pieces), algorithm)
    assert digest.hexdigest() == checksum(b"".join(pieces), algorithm)  # asked again: the same
    with pytest.raises(ShardError, match="unknown checksum algorithm"):
        StreamChecksum("md5")
