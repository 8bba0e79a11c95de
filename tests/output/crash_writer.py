"""Writer process for the crash test: writes rollouts r0..r{N-1} as Sample shards,
printing each batch of ids once durable. ``--slow`` widens the windows between the
steps of sealing (write, fsync, rename, manifest) so a random SIGKILL lands
mid-shard; ``--pause-at written|tmp|rename|dirsync|manifest|line`` stops inside the
3rd seal at that step (see ``_pause_at``), prints ``paused`` and waits to be killed."""

from __future__ import annotations

import os
import random
import sys
import time

from farm.trajectory import RolloutInfo, SAMPLE_SCHEMA, TurnTree, linearize, samples_to_table
from farm.output import ShardWriter


def rollout_table(i: int):
    rng = random.Random(i)
    t = TurnTree(f"s{i}")
    parent = None
    for k in range(3):
        out = [1000 + rng.randrange(1000) for _ in range(300)]
        parent = t.append(parent_id=parent, prompt_delta_ids=[k] * 200, output_ids=out,
                          output_logprobs=[-0.5] * len(out), finish_reason="stop").turn_id
    retry = t.append(parent_id=t.turns[0].turn_id, prompt_delta_ids=[9] * 50, output_ids=[1500] * 40,
                     output_logprobs=[-0.1] * 40, finish_reason="stop")
    assert retry
    return samples_to_table(linearize(t, RolloutInfo(rollout_id=f"r{i}", reward=float(i % 2))))


def _pause() -> None:
    print("paused", flush=True)
    time.sleep(60)  # held here until the test kills the process
    os._exit(3)  # never reached when the test kills us


def _pause_at(point: str) -> None:
    """Pause inside the 3rd seal at ``point``: written (shard bytes written, not fsynced),
    tmp (fsynced, not renamed), rename (renamed, directory not fsynced), dirsync
    (directory fsynced, no manifest line), manifest (line half written), line (line
    written, not fsynced)."""
    real_open, real_rename, real_write, real_fsync = os.open, os.rename, os.write, os.fsync
    state = {"seal": 0, "step": ""}

    def in_seal() -> bool:
        return state["seal"] == 3

    def open_(path, flags, *a):
        fd = real_open(path, flags, *a)
        if str(path).endswith(".tmp") and flags & os.O_EXCL and "/samples/" in str(path):
            state["seal"] += 1
            state["step"] = "written"
        return fd

    def rename(a, b):
        if in_seal() and point == "tmp":
            _pause()
        real_rename(a, b)
        state["step"] = "renamed"
        if in_seal() and point == "rename":
            _pause()

    def fsync(fd):
        if in_seal() and point == "written" and state["step"] == "written":
            _pause()
        real_fsync(fd)
        if in_seal() and point == "dirsync" and state["step"] == "renamed":
            _pause()

    def write(fd, data):
        if in_seal() and bytes(data[:9]) == b'{"bytes":':
            if point == "manifest":
                real_write(fd, bytes(data[: len(data) // 2]))
                _pause()
            n = real_write(fd, data)
            if point == "line":
                _pause()
            return n
        return real_write(fd, data)

    os.open, os.rename, os.write, os.fsync = open_, rename, write, fsync


def main() -> int:
    out_dir, n = sys.argv[1], int(sys.argv[2])
    if "--slow" in sys.argv:
        real_fsync, real_rename = os.fsync, os.rename

        def fsync(fd):
            time.sleep(random.uniform(0, 0.004))  # a slow disk: widens the window a kill lands in
            real_fsync(fd)

        def rename(a, b):
            time.sleep(random.uniform(0, 0.004))  # a slow disk, as for fsync
            real_rename(a, b)

        os.fsync, os.rename = fsync, rename
    if "--pause-at" in sys.argv:
        _pause_at(sys.argv[sys.argv.index("--pause-at") + 1])
    w = ShardWriter(out_dir, SAMPLE_SCHEMA, max_rows=7)
    print("ready", w.recovery.model_dump_json(), flush=True)
    for i in range(n):
        w.write_rollout(f"r{i}", rollout_table(i))
        done = w.take_durable()
        if done:
            print("durable", *done, flush=True)
    print("durable", *w.close(), flush=True)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
