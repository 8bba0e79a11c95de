"""GroupReader positions (farm.output.cursor): a trainer resumes where it stopped without
reading the manifest lines before it; a cursor the directory no longer matches says so."""

from __future__ import annotations

import pytest
from farm_helpers import make_result, reducer_config

from farm.actors.reducer import ReducerActor
from farm.errors import CursorError
from farm.output import shard_reader
from farm.output.cursor import GroupCursor
from farm.output.groups import Group, GroupReader
from farm.status import RolloutStatus

SIZE = 2


def _batches():
    """Rollouts committed batch by batch: groups done within a batch, a group whose two
    rollouts straddle batches (pending at the cursor), one with an infrastructure failure
    (no Samples: incomplete), and group indexes out of completion order (held back in
    task order)."""
    order = ["g3", "g0", "g1", "g2", "g5", "g4", "g6", "g7"]
    index = {g: int(g[1:]) for g in order}
    out: list[list] = [[] for _ in range(5)]
    for n, g in enumerate(order):
        for k in range(SIZE):
            b = min(4, n // 2 + k * (2 if g == "g1" else 0))  # g1's second rollout comes 2 batches later
            status = RolloutStatus.SANDBOX_ERROR if g == "g5" and k == 1 else RolloutStatus.COMPLETED
            r = make_result(f"{g}.{k}", status=status, reward=float((n + k) % 2))
            out[b].append(r.model_copy(update={"group_index": index[g]}))
    return out


def _commit(reducer: ReducerActor, results) -> None:
    for r in results:
        samples = reducer._linearize(r) if r.status.trainable else []
        reducer.store.add(r, samples)
    reducer.store.commit(reducer.store.take_buffer())


def _key(g: Group):
    return (g.group_id, g.complete, g.rollouts,
            [(s.rollout_id, s.chain_index, s.tokens.tolist(), s.loss_mask.tolist(), s.rollout_logprobs.tolist())
             for s in g.samples])  # fmt: skip


@pytest.fixture
def written(tmp_path):
    """(out dir, batches): a reducer's store that commits a batch when ``write(i)`` is called."""
    cfg = reducer_config(tmp_path / "out")
    reducer = ReducerActor(cfg, metrics=False)
    yield cfg.output.dir, reducer
    reducer.store.close()


@pytest.mark.parametrize("order", ["completion", "task"])
def test_a_reader_resumed_from_its_position_reads_the_rest(written, order):
    out, reducer = written
    batches = _batches()
    through = GroupReader(out, size=SIZE, order=order, include_incomplete=True)
    first = GroupReader(out, size=SIZE, order=order, include_incomplete=True)
    want, got = [], []
    for b in range(3):
        _commit(reducer, batches[b])
        want += through.poll()
        got += first.poll()
    held_back = got.pop()  # the trainer did not consume the last group it was handed
    cursor = GroupCursor.from_json(first.position(unconsumed=[held_back]).to_json())
    assert cursor.pending and cursor.unconsumed  # g1 waits for its second rollout
    if order == "task":
        assert cursor.held  # done, waiting for an earlier group index
    for b in range(3, 5):
        _commit(reducer, batches[b])
        want += through.poll()
    resumed = GroupReader(out, size=SIZE, order=order, include_incomplete=True, cursor=cursor)
    got += resumed.read()
    assert [_key(g) for g in got] == [_key(g) for g in want]
    assert resumed.yielded == len(want) == 8  # counted on from the cursor
    if order == "task":  # and the whole read, in one go, gives the same
        assert [_key(g) for g in GroupReader(out, size=SIZE, order="task", include_incomplete=True).read()] == \
            [_key(g) for g in want]  # fmt: skip


def test_a_resumed_reader_reads_no_manifest_line_before_its_cursor(written, monkeypatch):
    out, reducer = written
    batches = _batches()
    first = GroupReader(out, size=SIZE, include_incomplete=True)
    for b in range(3):
        _commit(reducer, batches[b])
        first.poll()
    cursor = first.position()
    for b in range(3, 5):
        _commit(reducer, batches[b])
    offsets: list[tuple[str, int]] = []
    real = shard_reader.read_manifest

    def spy(path, offset=0):
        offsets.append((path.name, offset))
        return real(path, offset)

    monkeypatch.setattr(shard_reader, "read_manifest", spy)
    groups = GroupReader(out, size=SIZE, include_incomplete=True, cursor=cursor).read()
    assert [g.group_id for g in groups] == ["g1", "g6", "g7"]
    where = {"manifest.jsonl": cursor.tables["samples"].offset,
             "rollouts.manifest.jsonl": cursor.tables["rollouts"].offset}  # fmt: skip
    assert offsets and all(offset == where[name] > 0 for name, offset in offsets), offsets


def test_a_stale_or_bad_cursor_says_why(written):
    out, reducer = written
    batches = _batches()
    first = GroupReader(out, size=SIZE)
    for b in range(2):
        _commit(reducer, batches[b])
        first.poll()
    cursor = first.position()
    reducer.store.rollouts.retract(["g3.0"])  # a lost Sample shard's rollout runs again: the manifest is rewritten
    with pytest.raises(CursorError, match=r"stale group cursor .*rollouts\.manifest\.jsonl has \d+ bytes, the cursor"):
        GroupReader(out, size=SIZE, cursor=cursor)
    for b in range(2, 5):  # longer again than where the cursor is: the line there is not the one it read
        _commit(reducer, batches[b])
    with pytest.raises(CursorError, match=r"stale group cursor .*rollouts\.manifest\.jsonl was rewritten"):
        GroupReader(out, size=SIZE, cursor=cursor)
    with pytest.raises(CursorError, match="size=2, order='completion'; this one has size=4"):
        GroupReader(out, size=4, cursor=cursor)
    with pytest.raises(CursorError, match="not a group cursor"):
        GroupCursor.from_json('{"version": 1, "size": 2}')
