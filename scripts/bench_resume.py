"""bench_resume: what a resumed run's driver holds for the rollouts already durable.

A resume is handed every durable rollout id by the reducer (``ReducerActor.done_ids``: a
list, pickled across Ray). The driver used to keep them as a set in its session and a
copy in its task stream for the whole run; it now keeps one bit a rollout on the stream's
groups (``farm.run.done.DoneRollouts``). Both, side by side in this process, on the ids of
a run of ``--rollouts`` in groups of ``--group`` over ``--epochs`` epochs, task ids shaped
like SWE-bench's (``owner__repo-12345``); each from the same pickled reply:

  ids_held_mb     traced memory held after the session's set and the stream's copy are
                  made and the reply's list is dropped (as before)
  bits_held_mb    the same with ``DoneRollouts.of`` (the reply's list dropped)
  ids_peak_mb / bits_peak_mb   the traced peak while each is made (the reply included)
  bits_build_s    seconds ``DoneRollouts.of`` takes (untraced; best of 3)
  plan_skip_s     seconds a finite stream's ``count()`` and its first group take on it

Run: ``.venv/bin/python scripts/bench_resume.py --rollouts 1000000``.
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``).
Last line: ``bench_resume: rollouts=… ids_held_mb=… bits_held_mb=… ids_peak_mb=… bits_peak_mb=…
bits_build_s=… plan_skip_s=…``.
"""

from __future__ import annotations

import argparse
import gc
import pickle
import time
import tracemalloc

from farm.rollout.model import make_rollout_id
from farm.run.config import StreamConfig
from farm.run.done import DoneRollouts
from farm.run.stream import TaskStream, group_id_of
from farm.tasks.model import Task

MB = 1024 * 1024


def traced(make, blob: bytes) -> tuple[float, float]:
    """(MB held once ``make(ids)``'s result is all that is left, MB at the peak)."""
    gc.collect()
    tracemalloc.start()
    try:
        ids = pickle.loads(blob)
        kept = make(ids)
        del ids
        gc.collect()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return held / MB, peak / MB


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=1_000_000)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    if args.quick:
        args.rollouts = 1_000
    per_epoch = max(1, args.rollouts // (args.group * args.epochs))
    tasks = [Task(id=f"owner{i % 97}__repo{i % 13}-{i:06d}", instruction="noop") for i in range(per_epoch)]
    ids = [make_rollout_id(group_id_of(t.id, e), k) for e in range(args.epochs) for t in tasks for k in range(args.group)]
    blob = pickle.dumps(ids)  # the reducer's reply as it crosses Ray
    del ids

    def as_sets(ids: list[str]):
        session = set(ids)  # RunSession.resume's set
        return session, set(session)  # and TaskStream's copy

    ids_held, ids_peak = traced(as_sets, blob)
    bits_held, bits_peak = traced(lambda ids: DoneRollouts.of(ids, tasks, args.group), blob)

    ids = pickle.loads(blob)
    builds = []
    for _ in range(3):
        t = time.perf_counter()
        done = DoneRollouts.of(ids, tasks, args.group)
        builds.append(time.perf_counter() - t)
    del ids
    assert done.placed == per_epoch * args.group * args.epochs and not done.outside
    stream = TaskStream("bench", tasks, args.group, StreamConfig(epochs=args.epochs), done=done)
    t = time.perf_counter()
    todo, skipped = stream.count()
    first = next(iter(stream.groups()), None)
    plan_s = time.perf_counter() - t
    assert (todo, skipped, first) == (0, len(done), None)
    print(f"{len(done)} done ids of {per_epoch} tasks x {args.epochs} epoch(s) x {args.group}; the reply pickled: "
          f"{len(blob) / MB:.1f} MB")
    print(f"bench_resume: rollouts={len(done)} ids_held_mb={ids_held:.1f} bits_held_mb={bits_held:.1f} "
          f"ids_peak_mb={ids_peak:.1f} bits_peak_mb={bits_peak:.1f} bits_build_s={min(builds):.2f} "
          f"plan_skip_s={plan_s:.2f}")


if __name__ == "__main__":
    main()
