"""Manifest checkpoints (farm.output.checkpoint): a resumed writer reads only the manifest
lines after its table's checkpoint and finds the same place as one that reads them all;
a checkpoint that is torn, corrupt, past the manifest's end, or older than a rewrite of
the manifest is ignored (a log line says so) and the answer is the same."""

from __future__ import annotations

import json
import logging
import shutil

import pytest

import farm.output.manifest as manifest_mod
from farm.output.checkpoint import checkpoint_path
from farm.output.config import OutputConfig
from farm.output.writer import OutputWriter
from farm.rollout.model import RolloutResult
from farm.status import RolloutStatus
from farm.trajectory import RolloutInfo, TurnTree, linearize

TABLES = ("manifest.jsonl", "rollouts.manifest.jsonl")


def _add(store: OutputWriter, rid: str) -> None:
    tree = TurnTree(f"s-{rid}")
    tree.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[7, 8], output_logprobs=[-0.1, -0.2],
                finish_reason="stop")  # fmt: skip
    result = RolloutResult(run_id="r", rollout_id=rid, group_id=rid, task_id=rid, sample_index=0, harness="h",
                           status=RolloutStatus.COMPLETED, reward=1.0)  # fmt: skip
    store.add(result, linearize(tree, RolloutInfo(rollout_id=rid, reward=1.0)))


def _open(out, **kw) -> OutputWriter:
    store = OutputWriter(out, OutputConfig(dir=str(out)), **kw)
    store.recover()
    store.reconcile()
    return store


def _write(out, rids, *, close: bool = True) -> OutputWriter:
    """One commit (one shard per table) per rollout; ``close=False``: the process dies
    after the last commit (no checkpoint at close)."""
    store = _open(out)
    for rid in rids:
        _add(store, rid)
        store.commit(store.take_buffer())
    if close:
        store.close()
    else:  # a crash: the tables' locks go with the process, nothing more is written
        store.samples.close()
        store.rollouts.close()
    return store


def _position(store: OutputWriter) -> dict:
    """Where a resumed run stands: the done ids, each table's totals and next shard number."""
    done = sorted(store.summaries)
    return {
        "done": done,
        "samples": (store.samples.totals, store.samples._next_seq, sorted(store.samples.durable_ids)),
        "rollouts": (store.rollouts.totals, store.rollouts._next_seq),
        "summary_of_first": store.summaries[done[0]].model_dump(exclude={"durable"}),
    }


@pytest.fixture
def parsed(monkeypatch):
    """Manifest lines parsed (JSON + validation), counted."""
    count = {"lines": 0}
    real = manifest_mod.parse_lines

    def spy(data, **kw):
        read = real(data, **kw)
        count["lines"] += len(read.entries)
        return read

    monkeypatch.setattr(manifest_mod, "parse_lines", spy)
    return count


def _resume_both(out, tmp_path, parsed) -> tuple[dict, dict, int, int]:
    """Open a copy of ``out`` without checkpoints and ``out`` with them: both positions and
    the manifest lines each open parsed."""
    ref = tmp_path / "ref"
    shutil.copytree(out, ref)
    counts, positions = [], []
    for where, on in ((ref, False), (out, True)):
        start = parsed["lines"]
        store = _open(where, checkpoints=on)
        counts.append(parsed["lines"] - start)
        positions.append(_position(store))
        store.close()
    return positions[0], positions[1], counts[0], counts[1]


def test_resume_reads_only_the_tail_and_finds_the_same_place(tmp_path, parsed):
    out = tmp_path / "out"
    _write(out, [f"a{i}" for i in range(12)])  # closed: a checkpoint covers all 12
    _write(out, [f"b{i}" for i in range(3)], close=False)  # 3 commits after it, then a crash
    assert all(checkpoint_path(out / m).is_file() for m in TABLES)
    without, with_cp, n_without, n_with = _resume_both(out, tmp_path, parsed)
    assert with_cp == without
    assert len(with_cp["done"]) == 15
    # 2 tables x 15 lines without the checkpoint; the 3 lines after it per table with it
    assert n_without == 2 * 15
    assert n_with == 2 * 3


def test_a_covered_rollout_is_still_written_once(tmp_path):
    out = tmp_path / "out"
    _write(out, ["a0", "a1"])
    store = _open(out)
    assert store.samples.from_checkpoint and store.rollouts.from_checkpoint
    assert not store.samples.entries_since_checkpoint  # nothing before the checkpoint is held in memory
    _add(store, "a0")  # a rollout handed back twice, durable before the checkpoint
    assert store.take_buffer().rollout_ids == []
    assert store.samples.write_rollout("a1", store.samples.schema.empty_table()) is False
    for rid in ("c0", "c1"):
        _add(store, rid)
        store.commit(store.take_buffer())
    assert len(store.rollouts.entries_since_checkpoint) == 2
    store.checkpoint()  # what the commits do every 256-1,024 lines: the entries it covers leave memory
    assert not store.rollouts.entries_since_checkpoint and not store.samples.entries_since_checkpoint
    store.close()
    assert [len(store.samples.entries), len(store.rollouts.entries)] == [4, 4]


def _damage_checkpoint_tmp(out) -> None:
    for m in TABLES:  # a crash mid-write of the next checkpoint: its temp file, torn
        cp = checkpoint_path(out / m)
        cp.with_name(cp.name + ".tmp").write_bytes(cp.read_bytes()[: 40])


def _damage_checkpoint(out) -> None:
    cp = checkpoint_path(out / "manifest.jsonl")
    data = cp.read_bytes()
    assert data.count(b'"rows":') == 1
    cp.write_bytes(data.replace(b'"rows":', b'"rows": '))  # still JSON, but its checksum no longer matches


def _checkpoint_past_the_end(out) -> None:
    # the manifest cut back to fewer lines than the checkpoint covers (a restored older copy)
    m = out / "manifest.jsonl"
    lines = m.read_bytes().splitlines(keepends=True)
    m.write_bytes(b"".join(lines[:-4]))


def _manifest_rewritten(out) -> None:
    # the first line dropped (its shard left in place): every later line moved
    m = out / "rollouts.manifest.jsonl"
    lines = m.read_bytes().splitlines(keepends=True)
    m.write_bytes(b"".join(lines[1:]))


def _covered_shard_lost(out) -> None:
    m = out / "manifest.jsonl"
    first = m.read_bytes().split(b"\n")[0]
    (out / json.loads(first)["shard"]).unlink()


def _tail_shard_lost(out) -> None:
    m = out / "manifest.jsonl"
    last = m.read_bytes().rstrip(b"\n").split(b"\n")[-1]  # b0's line, after the checkpoint
    (out / json.loads(last)["shard"]).unlink()


def _segments_of(out, manifest="manifest.jsonl"):
    return sorted(p for p in out.iterdir() if p.name.startswith(f".{manifest}.ids-"))


def _segment_flipped(out) -> None:
    seg = _segments_of(out)[0]
    data = bytearray(seg.read_bytes())
    data[20] ^= 0xFF  # a digest's byte
    seg.write_bytes(bytes(data))


def _segment_lost(out) -> None:
    _segments_of(out, "rollouts.manifest.jsonl")[0].unlink()


def _segment_unlisted(out) -> None:
    # a crash after a segment was written, before the checkpoint that lists it
    (out / ".manifest.jsonl.ids-000099-deadbeef").write_bytes(b"FARMIDS1" + bytes(8))


@pytest.mark.parametrize(
    "damage, used",
    [(_damage_checkpoint_tmp, True), (_damage_checkpoint, False), (_checkpoint_past_the_end, False),
     (_manifest_rewritten, False), (_covered_shard_lost, False), (_tail_shard_lost, False),
     (_segment_flipped, False), (_segment_lost, False), (_segment_unlisted, True)],
)  # fmt: skip
def test_a_bad_checkpoint_is_ignored_and_the_answer_is_the_same(tmp_path, parsed, caplog, damage, used):
    out = tmp_path / "out"
    _write(out, [f"a{i}" for i in range(8)])
    _write(out, ["b0"], close=False)
    damage(out)
    with caplog.at_level(logging.WARNING):
        without, with_cp, n_without, n_with = _resume_both(out, tmp_path, parsed)
    assert with_cp == without
    if used:
        assert n_with == 2 and "checkpoint not used" not in caplog.text
    else:
        assert n_with >= n_without - 2 and "checkpoint not used" in caplog.text


def test_covered_ids_are_digests_and_a_digest_match_is_confirmed(tmp_path, monkeypatch):
    import farm.output.durable as durable

    import farm.output.segments as segments

    for module in (durable, segments):
        monkeypatch.setattr(module, "digest", lambda rid: 7)  # every id collides with every other
    out = tmp_path / "out"
    _write(out, ["a0", "a1", "a2"])
    store = _open(out)
    ids = store.samples._durable
    assert [len(s.digests) for s in ids._segments] == [3] and ids._segments[0].digests.dtype.itemsize == 8
    assert not ids._recent
    whole = []
    monkeypatch.setattr(durable.DurableIds, "_listed", lambda self, rid: whole.append(rid) or False)
    assert "a1" in ids  # confirmed by the manifest line its offset points at (one of the three)
    assert whole == []
    assert "b0" not in ids  # no line at its digest's offsets lists it: the whole manifest is searched
    assert whole == ["b0"]
    monkeypatch.undo()
    for module in (durable, segments):
        monkeypatch.setattr(module, "digest", lambda rid: 7)
    _add(store, "b0")  # a new rollout whose digest matches a covered one is written, not refused
    store.commit(store.take_buffer())
    _add(store, "a2")  # a covered one is refused
    assert store.take_buffer().rollout_ids == []
    assert sorted(store.summaries) == ["a0", "a1", "a2", "b0"]
    store.close()


def test_a_long_run_keeps_only_the_lines_since_its_last_checkpoint(tmp_path, monkeypatch):
    import farm.output.writer as writer_mod

    monkeypatch.setattr(writer_mod, "CHECKPOINT_MIN_LINES", 16)
    out = tmp_path / "out"
    store = _write(out, [f"a{i}" for i in range(100)], close=False)  # one line per table per commit
    for w in (store.samples, store.rollouts):
        # what the writer holds per rollout: the lines and the ids since its last checkpoint
        assert len(w.entries_since_checkpoint) < 16 and len(w._durable._recent) < 16
        covered = [s.ref.count for s in w._durable._segments]
        assert sum(covered) > 84 and len(w._durable) == 100
        # each checkpoint wrote only the ids since the one before; merged as a binary counter
        assert all(a > b for a, b in zip(covered, covered[1:])), covered
    assert checkpoint_path(out / "manifest.jsonl").is_file()


def test_big_commits_checkpoint_by_rollouts_too(tmp_path, monkeypatch):
    """At a high rate a commit holds hundreds of rollouts: the ids since the last
    checkpoint (kept as strings) stay bounded by rollouts, not only by lines."""
    import farm.output.writer as writer_mod

    monkeypatch.setattr(writer_mod, "CHECKPOINT_MAX_ROLLOUTS", 40)
    store = _open(tmp_path / "out")
    for c in range(10):  # 10 commits of 12 rollouts: far under CHECKPOINT_MIN_LINES lines
        for i in range(12):
            _add(store, f"c{c}.{i}")
        store.commit(store.take_buffer())
    for w in (store.samples, store.rollouts):
        assert len(w._durable._recent) < 40 and sum(e.rows for e in w.entries_since_checkpoint) < 40
        assert sum(s.ref.count for s in w._durable._segments) >= 80 and len(w._durable) == 120
    store.close()


@pytest.mark.parametrize("chunk", [3, 64, 1 << 16])
def test_the_last_covered_line_is_found_reading_backwards(tmp_path, monkeypatch, chunk):
    import farm.output.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "_CHUNK", chunk)
    path = tmp_path / "m"
    lines = [b"first\n", b"x" * 200 + b"\n", b"third line\n"]
    path.write_bytes(b"".join(lines) + b"torn")
    ends = [6, 6 + 201, 6 + 201 + 11]
    assert [checkpoint.last_line(path, e) for e in ends] == [(0, lines[0]), (6, lines[1]), (207, lines[2])]
    assert checkpoint.last_line(path, 0) == (0, b"")


def test_a_rollout_retracted_after_the_checkpoint_is_gone_from_it(tmp_path):
    out = tmp_path / "out"
    _write(out, ["a0", "a1", "a2"])
    store = _open(out)
    store.rollouts.retract(["a1"])  # its row rewritten out of a shard the checkpoint covers
    store.samples.retract(["a1"])
    assert "a1" not in store.summaries and sorted(store.summaries) == ["a0", "a2"]
    store.close()  # its checkpoint lists a0, a2
    again = _open(out)
    assert again.rollouts.from_checkpoint and sorted(again.summaries) == ["a0", "a2"]
    again.close()


def test_segments_hold_what_each_checkpoint_added_and_read_back(tmp_path, monkeypatch):
    """Each checkpoint writes only the ids its table gained since the one before (a segment
    file of digests, line offsets and ids); an open reads them back as the same ids."""
    import farm.output.writer as writer_mod

    monkeypatch.setattr(writer_mod, "CHECKPOINT_MIN_LINES", 5)
    out = tmp_path / "out"
    rids = [f"a{i}" for i in range(23)]
    store = _write(out, rids, close=False)  # checkpoints after 5, 10, 15, 20 commits, 3 lines after
    sizes = [s.ref.count for s in store.samples._durable._segments]
    assert sizes == [20]  # 5 + 5 -> 10; 10 + 5 + 5 -> 20 (merged when the newest are as large)
    manifest = (out / "manifest.jsonl").read_bytes()
    cp = checkpoint_path(out / "manifest.jsonl").read_bytes()
    assert b'"a1"' not in cp and len(cp) < 1000  # the checkpoint lists segments, not ids
    assert [p.name for p in _segments_of(out)] == [s.ref.name for s in store.samples._durable._segments]
    again = _open(out)
    ids = again.samples._durable
    assert ids.ids() == set(rids) and len(ids) == 23
    assert all(r in ids for r in rids) and "a23" not in ids and "a" not in ids
    seg = ids._segments[0]
    at = seg.offsets(0, seg.ref.count).tolist()  # each id's offset is the start of the line listing it
    for rid, offset in zip(sorted(seg.ids(), key=lambda r: int(digest_of(r))), at):
        line = manifest[offset : manifest.index(b"\n", offset)]
        assert rid in json.loads(line)["rollout_ids"]
    again.close()


def digest_of(rid: str):
    from farm.output.segments import digest

    return digest(rid)


@pytest.mark.parametrize("short_writes", [False, True])
def test_a_merge_keeps_every_digest_with_its_offset(tmp_path, monkeypatch, short_writes):
    import os
    import random

    import numpy as np

    import farm.output.segments as segments

    monkeypatch.setattr(segments, "MERGE_CHUNK", 4)  # many merge steps
    if short_writes:  # a pwrite may write less than it is given: the rest is written after it
        pwrite = os.pwrite
        monkeypatch.setattr(os, "pwrite", lambda fd, data, at: pwrite(fd, memoryview(data)[:5], at))
    monkeypatch.setattr(segments, "digest", lambda rid: hash(rid) % 50)  # equal digests across parts
    manifest = tmp_path / "m.jsonl"
    rng = random.Random(1)
    parts, want = [], []
    for k, n in enumerate([17, 9, 1, 30]):
        ids = [f"p{k}-{i}" for i in range(n)]
        offsets = [rng.randrange(1 << 40) for _ in ids]
        parts.append(segments.write_segment(manifest, k, ids, offsets))
        want += [(hash(r) % 50, o, r) for r, o in zip(ids, offsets)]
    merged = segments.merge_segments(manifest, 9, parts)
    d = merged.digests
    assert merged.ref.count == len(want) and bool(np.all(d[1:] >= d[:-1]))
    got = sorted(zip(d.tolist(), merged.offsets(0, len(d)).tolist()))
    assert got == sorted((dg, o) for dg, o, _ in want)
    assert sorted(merged.ids()) == sorted(r for _, _, r in want)
    loaded, why = segments.load_segment(manifest, merged.ref)
    assert why is None and loaded.digests.tolist() == d.tolist()
