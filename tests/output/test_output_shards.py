"""ShardWriter / ShardReader on real files: rotation, durability, dedup, recovery,
following, two tables in one directory, plain pyarrow.dataset access."""

from __future__ import annotations

import json
import os
import threading

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from trj_helpers import add

from farm.errors import ShardError
from farm.trajectory import SAMPLE_SCHEMA, RolloutInfo, TurnTree, linearize, samples_to_table, table_to_samples
from farm.output import ShardReader, ShardWriter, open_sample_reader, open_sample_writer
from farm.output.config import OutputConfig
from farm.output.torch_data import make_torch_dataset, torch_available

KV = pa.schema([pa.field("rollout_id", pa.string()), pa.field("value", pa.int64())])


def samples_for(rid: str, n_turns: int = 2) -> pa.Table:
    t = TurnTree(f"s-{rid}")
    parent = None
    for i in range(n_turns):
        parent = add(t, parent, [1, 2, i], [100 + i, 101 + i]).turn_id
    return samples_to_table(linearize(t, RolloutInfo(rollout_id=rid, reward=1.0)))


def kv(rid: str, n: int = 1) -> list[dict]:
    return [{"rollout_id": rid, "value": i} for i in range(n)]


def manifest_lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_write_rotate_read(tmp_path, fmt):
    with open_sample_writer(OutputConfig(dir=str(tmp_path), format=fmt, shard_max_rows=3)) as w:
        for i in range(7):
            assert w.write_rollout(f"r{i}", samples_for(f"r{i}"))
        assert w.take_durable() == ["r0", "r1", "r2", "r3", "r4", "r5"]
        assert w.pending_ids == ["r6"] and not w.is_durable("r6")
        assert w.flush() == ["r6"] and w.is_durable("r6")
    lines = manifest_lines(tmp_path / "manifest.jsonl")
    assert [x["rollout_ids"] for x in lines] == [["r0", "r1", "r2"], ["r3", "r4", "r5"], ["r6"]]
    assert all(x["shard"].startswith("samples/samples-") and x["format"] == fmt for x in lines)
    assert all(x["checksum"].startswith("xxh3_128:") for x in lines)
    reader = open_sample_reader(tmp_path, verify=True)
    table = reader.read_table()
    assert table.num_rows == 7 and table.schema.equals(SAMPLE_SCHEMA, check_metadata=False)
    assert sum(b.num_rows for b in reader.iter_batches()) == 7
    assert reader.rollout_ids() == {f"r{i}" for i in range(7)}
    samples = table_to_samples(table)
    assert [s.rollout_id for s in samples] == [f"r{i}" for i in range(7)]
    # plain pyarrow.dataset reads the same rows
    plain = ds.dataset(tmp_path / "samples", format="ipc" if fmt == "arrow" else "parquet").to_table()
    assert sorted(plain.column("rollout_id").to_pylist()) == sorted(table.column("rollout_id").to_pylist())


def test_rotation_by_bytes_never_splits_a_rollout(tmp_path):
    big = samples_for("x", n_turns=40)
    with ShardWriter(tmp_path, SAMPLE_SCHEMA, max_bytes=big.nbytes + 10, max_rows=10_000) as w:
        for i in range(3):
            w.write_rollout(f"r{i}", samples_for(f"r{i}", n_turns=40))
    lines = manifest_lines(tmp_path / "manifest.jsonl")
    assert [x["rollout_ids"] for x in lines] == [["r0"], ["r1"], ["r2"]]


def test_duplicates_are_noops_across_restarts(tmp_path):
    with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
        assert w.write_rollout("a", kv("a", 2)) is True
        assert w.take_durable() == ["a"]  # durable on return with flush_every_rollout
        assert w.write_rollout("a", kv("a")) is False
    with ShardWriter(tmp_path, KV, name="kv") as w:
        assert w.is_durable("a") and w.write_rollout("a", kv("a")) is False
        assert w.write_rollout("b", []) is True  # a rollout with no rows is still recorded
        assert w.write_rollout("b", kv("b")) is False  # pending: also a no-op
        assert w.flush() == ["b"]
    r = ShardReader(tmp_path, name="kv", schema=KV)
    assert r.read_table().num_rows == 2 and r.rollout_ids() == {"a", "b"}
    assert [e.rows for e in r.entries()] == [2, 0]


def test_two_tables_share_a_directory(tmp_path):
    with ShardWriter(tmp_path, SAMPLE_SCHEMA) as s, ShardWriter(tmp_path, KV, name="rollouts") as k:
        s.write_rollout("r", samples_for("r"))
        k.write_rollout("r", kv("r"))
    assert (tmp_path / "manifest.jsonl").exists() and (tmp_path / "rollouts.manifest.jsonl").exists()
    assert ShardReader(tmp_path, name="rollouts").read_table().column_names == ["rollout_id", "value"]
    assert ShardReader(tmp_path).read_table().num_rows == 1
    assert ds.dataset(tmp_path / "rollouts", format="ipc").to_table().num_rows == 1


def test_one_writer_per_table_and_schema_checked(tmp_path):
    w = ShardWriter(tmp_path, KV, name="kv")
    with pytest.raises(ShardError, match="another writer"):
        ShardWriter(tmp_path, KV, name="kv")
    with pytest.raises(ShardError, match="schema"):
        w.write_rollout("x", pa.table({"other": [1]}))
    w.close()
    w.close()  # idempotent
    with pytest.raises(ShardError, match="closed"):
        w.write_rollout("y", kv("y"))
    ShardWriter(tmp_path, KV, name="kv").close()  # the lock was released
    assert ShardReader(tmp_path, name="kv", schema=KV).read_table().num_rows == 0
    with pytest.raises(ShardError, match="no shards"):
        ShardReader(tmp_path, name="kv").read_table()


def test_checksum_verification_detects_corruption(tmp_path):
    with ShardWriter(tmp_path, KV, name="kv") as w:
        w.write_rollout("a", kv("a", 100))
    entry = ShardReader(tmp_path, name="kv").entries()[0]
    path = tmp_path / entry.shard
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="checksum"):
        ShardReader(tmp_path, name="kv", verify=True).read_table()


def test_recovery_after_a_crash(tmp_path):
    with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
        for rid in "abc":
            w.write_rollout(rid, kv(rid))
    table_dir, manifest = tmp_path / "kv", tmp_path / "kv.manifest.jsonl"
    lines = manifest_lines(manifest)
    # a) temp file of a shard being written; b) a shard renamed but not yet in the manifest;
    # c) a manifest line cut mid-write; d) a line whose shard vanished
    (table_dir / ".kv-000009-deadbeef.arrow.tmp").write_bytes(b"partial")
    orphan = table_dir / "kv-000010-cafecafe.arrow"
    orphan.write_bytes((table_dir / lines[0]["shard"].split("/")[1]).read_bytes())
    (tmp_path / lines[1]["shard"]).unlink()
    with open(manifest, "ab") as fh:
        fh.write(b'{"shard": "kv/kv-0000')
    r = ShardReader(tmp_path, name="kv")
    assert [e.rollout_ids for e in r.entries()] == [["a"], ["b"], ["c"]]  # complete lines only
    w = ShardWriter(tmp_path, KV, name="kv")
    rep = w.recovery
    assert (rep.temp_files_removed, rep.truncated_manifest_tail, rep.entries_dropped) == (1, True, 1)
    assert rep.missing_shards == [lines[1]["shard"]] and rep.lost_rollouts == ["b"]
    # the unlisted copy claims rollout a, which line 0 commits: quarantined, not deleted, not adopted
    assert rep.quarantined == ["quarantine/kv/kv-000010-cafecafe.arrow"] and not rep.adopted
    assert w.durable_ids == {"a", "c"} and not orphan.exists()
    assert (tmp_path / "quarantine" / "kv" / orphan.name).read_bytes() == (tmp_path / lines[0]["shard"]).read_bytes()
    assert sorted(p.name for p in table_dir.iterdir()) == sorted(x["shard"].split("/")[1] for x in (lines[0], lines[2]))
    assert w.write_rollout("b", kv("b")) and w.flush() == ["b"]
    w.close()
    assert sorted(r.read_table().column("rollout_id").to_pylist()) == ["a", "b", "c"]
    assert manifest.read_bytes().endswith(b"\n")


def test_follow_yields_shards_as_they_land(tmp_path):
    reader = ShardReader(tmp_path, name="kv")
    with pytest.raises(ValueError):
        next(reader.follow())
    assert list(reader.follow(timeout=0.05, poll_interval=0.01)) == []  # no manifest yet
    stop = threading.Event()
    got: list[list[str]] = []
    landed = threading.Semaphore(0)

    def consume():
        for entry in reader.follow(poll_interval=0.01, stop=stop):
            got.append(entry.rollout_ids)
            landed.release()

    th = threading.Thread(target=consume)
    th.start()
    try:
        with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
            for i in range(5):
                w.write_rollout(f"r{i}", kv(f"r{i}"))
                assert landed.acquire(timeout=10), f"shard {i} not seen"
            w.write_rollout("last", kv("last"))
    finally:
        stop.set()  # the follower takes a last look after stop: "last" is not lost
        th.join(timeout=10)
    assert not th.is_alive()
    assert got == [[f"r{i}"] for i in range(5)] + [["last"]]
    batches = list(reader.follow_batches(stop=lambda: True))
    assert sum(b.num_rows for b in batches) == 6


def test_follow_survives_a_manifest_rewrite(tmp_path):
    with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
        w.write_rollout("a", kv("a"))
        w.write_rollout("b", kv("b"))
    reader = ShardReader(tmp_path, name="kv")
    calls = iter(range(100))
    seen = []
    for e in reader.follow(poll_interval=0.01, stop=lambda: next(calls) >= 3):
        seen.append(e.rollout_ids[0])
        if seen == ["a", "b"]:
            os.unlink(tmp_path / e.shard)  # recovery will drop b's line and rewrite the manifest
            with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
                w.write_rollout("b", kv("b"))
    assert seen == ["a", "b", "b"]  # re-written b shows up once more, a is not repeated


def test_torch_wrapper_is_optional(tmp_path):
    reader = open_sample_reader(tmp_path)
    if torch_available():  # pragma: no cover - torch is not installed here
        assert make_torch_dataset(reader) is not None
    else:
        with pytest.raises(ImportError, match="torch"):
            make_torch_dataset(reader)


def test_corrupt_manifest_middle_line_is_an_error(tmp_path):
    with ShardWriter(tmp_path, KV, name="kv", flush_every_rollout=True) as w:
        w.write_rollout("a", kv("a"))
        w.write_rollout("b", kv("b"))
    manifest = tmp_path / "kv.manifest.jsonl"
    lines = manifest.read_bytes().split(b"\n")
    manifest.write_bytes(lines[0][:20] + b"\n" + lines[1] + b"\n")
    with pytest.raises(ShardError, match="corrupt manifest line"):
        ShardReader(tmp_path, name="kv").entries()
    with pytest.raises(ShardError, match="corrupt manifest line"):
        ShardWriter(tmp_path, KV, name="kv")
    manifest.write_bytes(lines[1] + b"\n")  # the lock was released despite the error
    with ShardWriter(tmp_path, KV, name="kv") as w:  # a's shard is unlisted now: checked and adopted
        assert w.durable_ids == {"a", "b"} and w.recovery.adopted == [json.loads(lines[0])["shard"]]
    # a corrupt middle line is damage, not a crash: rebuilt from the shards only when asked
    manifest.write_bytes(b"garbage\n" + lines[1] + b"\n")
    with ShardWriter(tmp_path, KV, name="kv", rebuild_manifest=True) as w:
        assert w.durable_ids == {"a", "b"} and w.recovery.manifest_rebuilt
        assert sorted(w.recovery.adopted) == sorted(json.loads(x)["shard"] for x in lines[:2])
    assert (tmp_path / "quarantine" / "kv" / "kv.manifest.jsonl").read_bytes().startswith(b"garbage")


def _shard_files_only(monkeypatch, write):
    """``os.write`` replaced by ``write(real_write, fd, data)`` for the shard files being
    written (temporary names in a table directory); every other write as it is."""
    real = os.write

    def patched(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp"):
            return write(real, fd, data)
        return real(fd, data)

    monkeypatch.setattr(os, "write", patched)


@pytest.mark.parametrize(("fmt", "compression"), [("arrow", None), ("arrow", "zstd"), ("parquet", None)])
def test_a_shard_is_the_bytes_its_format_writer_makes_checksummed_as_written(tmp_path, monkeypatch, fmt, compression):
    """The writer's pieces go straight to the file (never put together in memory), through
    short writes too: the file is byte for byte what pyarrow writes for the shard's one
    table, and its manifest checksum is the file's."""
    import pyarrow.parquet as pq

    from farm.output.integrity import checksum

    _shard_files_only(monkeypatch, lambda real, fd, data: real(fd, bytes(memoryview(data)[:4096])))  # short writes
    tables = [samples_for(f"r{i}", n_turns=i + 1) for i in range(3)]
    long = TurnTree("s-long")  # a 1.2 MB token column: pieces hashed in the checksum's thread
    add(long, None, list(range(1000)), [7] * 300_000, output_logprobs=[-0.5] * 300_000)
    tables.append(samples_to_table(linearize(long, RolloutInfo(rollout_id="long", reward=1.0))))
    with ShardWriter(tmp_path, SAMPLE_SCHEMA, format=fmt, compression=compression) as w:
        for i, t in enumerate(tables):
            w.write_rollout(f"r{i}", t)
        w.write_rollout("empty", SAMPLE_SCHEMA.empty_table())
    (entry,) = w.entries
    data = (tmp_path / entry.shard).read_bytes()
    table = pa.concat_tables(tables).combine_chunks().replace_schema_metadata(SAMPLE_SCHEMA.metadata)
    sink = pa.BufferOutputStream()
    if fmt == "arrow":
        with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as iw:
            iw.write_table(table)
    else:
        pq.write_table(table, sink, compression="none")
    assert data == sink.getvalue().to_pybytes()
    assert entry.bytes == len(data) and entry.checksum == checksum(data) and entry.rows == 4
    assert open_sample_reader(tmp_path, verify=True).read_table().num_rows == 4


def test_a_shard_write_that_fails_lists_nothing_keeps_the_rows_and_leaves_no_thread(tmp_path, monkeypatch):
    """A disk full mid-shard: the error is raised, no line names a shard, nothing is durable,
    the checksum's thread has ended; the rows are still buffered and a later flush seals them."""
    import errno

    before = set(threading.enumerate())
    written = [0]

    def full(real, fd, data):  # the disk fills up after 1 MiB of the shard
        if written[0] + memoryview(data).nbytes > 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, data)
        written[0] += n
        return n

    w = ShardWriter(tmp_path, KV, name="kv", max_rows=1 << 20)
    w.write_rollout("a", kv("a", 200_000))  # a 1.6 MB column: its checksum runs in a thread
    with monkeypatch.context() as m:
        _shard_files_only(m, full)
        with pytest.raises(OSError, match="No space left"):
            w.flush()
    assert set(threading.enumerate()) == before
    assert not (tmp_path / "kv.manifest.jsonl").exists() and not w.is_durable("a") and w.pending_ids == ["a"]
    assert w.flush() == ["a"]
    w.close()
    assert ShardReader(tmp_path, name="kv", verify=True).read_table().num_rows == 200_000
