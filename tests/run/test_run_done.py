"""A resumed run's done rollouts as bits on the stream's groups (farm.run.done): exactly the
set of ids they replace, for every way a task id or an id can be written, and without
keeping the ids. Fast: no Ray."""

from __future__ import annotations

import random
import tracemalloc

from farm.rollout.model import make_rollout_id
from farm.run.config import StreamConfig
from farm.run.done import DoneRollouts
from farm.run.stream import TaskStream, group_id_of
from farm.tasks.model import Task

# task ids that look like parts of a rollout id: dots, '@', '@<n>', digits
TRICKY = ["a", "a@1", "pkg.mod", "pkg.mod.3", "x@y", "b@2@3", "7", "c@0", "c@01", "django__django-11099"]


def _tasks(ids) -> list[Task]:
    return [Task(id=i, instruction="fix it") for i in ids]


def _bits(done: DoneRollouts, task_id: str, epoch: int, n: int) -> set[int]:
    mask = done.mask(task_id, epoch)
    return {i for i in range(n) if mask >> i & 1}


def test_each_id_is_its_groups_bit_and_the_rest_are_outside():
    tasks = _tasks(TRICKY)
    ids = [
        "a.0", "a.2", "a@1.1",  # a's epoch 0 and 1; "a@1.1" is also task "a@1"'s epoch 0 (both, as the set matched)
        "pkg.mod.3.0", "pkg.mod.1", "x@y.0", "b@2@3.1", "7.0", "c@0.0", "c@01.0", "a@2.3",
        "a.01", "a@02.0", "a.8", "a.", "a.x", "a.-1", "a.\u00b2", "a", "zz.0", "a@0.0@", "a@.0",  # outside
    ]  # fmt: skip
    done = DoneRollouts.of(ids, tasks, n_samples=8)
    assert _bits(done, "a", 0, 8) == {0, 2} and _bits(done, "a", 1, 8) == {1} and _bits(done, "a", 2, 8) == {3}
    assert _bits(done, "a@1", 0, 8) == {1}
    assert _bits(done, "pkg.mod.3", 0, 8) == {0} and _bits(done, "pkg.mod", 0, 8) == {1}
    assert _bits(done, "pkg.mod", 3, 8) == set()  # "pkg.mod.3.0" is task pkg.mod.3's, no epoch is written with a dot
    assert _bits(done, "x@y", 0, 8) == {0} and _bits(done, "b@2@3", 0, 8) == {1} and _bits(done, "7", 0, 8) == {0}
    assert _bits(done, "c@0", 0, 8) == {0} and _bits(done, "c@01", 0, 8) == {0} and _bits(done, "c", 1, 8) == set()
    assert done.placed == 11 and done.outside == 11 and len(done) == 22 and done.bits == 12  # "a@1.1": two groups
    again = DoneRollouts.of(ids + ["a.0", "a@1.1"], tasks, n_samples=8)  # a repeated id counts once
    assert len(again) == 22 and again.placed == 11


def test_masks_agree_with_the_set_of_ids_on_every_group():
    rng = random.Random(7)
    tasks, n, epochs = _tasks(TRICKY), 5, 3
    every = [make_rollout_id(group_id_of(t.id, e), i) for e in range(epochs) for t in tasks for i in range(n)]
    for trial in range(40):
        ids = set(rng.sample(every, rng.randrange(len(every))))
        ids |= {f"{rng.choice(TRICKY)}{rng.choice(['', '@', '@0', '@4', '.9', '.'])}.{rng.randrange(12)}" for _ in range(8)}
        done = DoneRollouts.of(sorted(ids), tasks, n_samples=n)
        for e in range(epochs):
            for t in tasks:
                want = {i for i in range(n) if make_rollout_id(group_id_of(t.id, e), i) in ids}
                assert _bits(done, t.id, e, n) == want, (trial, t.id, e)
        assert len(done) == len(ids)


def test_a_stream_skips_exactly_the_done_ids_and_keeps_the_session_s_bits():
    tasks, n = _tasks(TRICKY), 3
    cfg = StreamConfig(epochs=2)
    ids = {"a.1", "a@1.1", "pkg.mod.3.2", "7.0", "7.1", "7.2", "c@01@1.0", "elsewhere.0"}
    done = DoneRollouts.of(ids, tasks, n_samples=n)
    stream = TaskStream("r", tasks, n, cfg, done=done)
    assert stream.done is done  # not copied
    planned = [s.rollout_id for s in stream.plan()]
    every = [make_rollout_id(group_id_of(t.id, e), i) for e in range(2) for t in tasks for i in range(n)]
    assert planned == [rid for rid in every if rid not in ids]
    # "elsewhere.0" is no group of this stream; "a@1.1" is two of its rollouts (a's epoch 1, a@1's epoch 0)
    assert stream.count() == (len(planned), len(ids))


def test_the_bits_hold_a_fraction_of_what_the_ids_hold():
    tasks = _tasks(f"org__repo-{i:06d}" for i in range(2_500))
    ids = [make_rollout_id(t.id, i) for t in tasks for i in range(8)]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        done = DoneRollouts.of(ids, tasks, n_samples=8)
        bits = tracemalloc.get_traced_memory()[0] - base
        as_set = set(ids)
        strings = sum(map(len, ids))  # at least a byte a character: the set's strings are the list's
        the_set = tracemalloc.get_traced_memory()[0] - base - bits + strings
    finally:
        tracemalloc.stop()
    assert done.placed == 20_000 and len(as_set) == 20_000
    assert all(key is t.id for key, t in zip(done._masks[0], tasks))  # the tasks' own strings, not the ids' copies
    assert bits * 8 < the_set, (bits, the_set)
