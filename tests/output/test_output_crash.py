"""Kill a real writer process (SIGKILL) at random points, several times: the
directory stays consistent after every kill, nothing acknowledged is lost, and a
rerun completes with every rollout exactly once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from farm.trajectory import table_to_samples
from farm.output import ShardReader

SCRIPT = Path(__file__).with_name("crash_writer.py")
N = 600
ROWS_PER_ROLLOUT = 2  # main chain + retry branch


class Writer:
    def __init__(self, out: Path, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out), str(N), *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.paused = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("ready"):
                self.ready.set()
            if line.startswith("paused"):
                self.paused.set()

    def acknowledged(self) -> set[str]:
        return {rid for line in list(self.lines) if line.startswith("durable") for rid in line.split()[1:]}

    def finish(self, timeout: float = 60) -> None:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.thread.join(timeout=10)


def check_consistent(out: Path, acknowledged: set[str]) -> set[str]:
    reader = ShardReader(out, verify=True)
    entries = reader.entries()
    ids = [rid for e in entries for rid in e.rollout_ids]
    assert len(ids) == len(set(ids)), "a rollout is in two manifest lines"
    assert acknowledged <= set(ids), "an acknowledged rollout was lost"
    table = reader.read_table()  # every listed shard exists, is complete, and matches its checksum
    counts = Counter(table.column("rollout_id").to_pylist())
    assert all(counts[rid] == ROWS_PER_ROLLOUT for rid in ids) and set(counts) <= set(ids)
    for s in table_to_samples(table):
        assert s.prompt_length + s.response_length == len(s.tokens)
    # no line is half-written except possibly the very last one, which readers skip
    raw = (out / "manifest.jsonl").read_bytes() if (out / "manifest.jsonl").exists() else b""
    for line in raw.split(b"\n")[:-1]:
        json.loads(line)
    # visible (non-dot) shard files are complete: listed, or a whole orphan the next writer removes
    listed = {out / e.shard for e in entries}
    for p in (out / "samples").glob("samples-*"):
        if p not in listed:
            assert ds.dataset(p, format="ipc").to_table().num_rows > 0
    return set(ids)


def _kill(w: Writer) -> None:
    w.proc.send_signal(signal.SIGKILL)
    w.finish()


@pytest.mark.slow
def test_sigkill_mid_shard_then_rerun(tmp_path):
    out = tmp_path / "out"
    rng = random.Random(1234)
    durable: set[str] = set()
    recoveries: list[dict] = []

    def after_kill(w: Writer) -> None:
        nonlocal durable
        recoveries.append(json.loads(w.lines[0].split(" ", 1)[1]))
        now = check_consistent(out, w.acknowledged())
        assert durable <= now
        durable = now

    # killed inside a seal at each step of sealing (crash_writer._pause_at)
    points = ("written", "tmp", "rename", "dirsync", "manifest", "line")
    for point in points:
        w = Writer(out, "--pause-at", point)
        assert w.paused.wait(60), f"never paused at {point}: {w.lines}"
        _kill(w)
        after_kill(w)
    # killed at random points, with widened windows between the steps of sealing
    kills = 0
    for _ in range(4):
        w = Writer(out, "--slow")
        assert w.ready.wait(60), "no ready line"
        time.sleep(rng.uniform(0.05, 0.3))  # the kill lands at a random point of the writing
        if w.proc.poll() is None:
            kills += 1
        _kill(w)
        after_kill(w)
    assert kills >= 2, "the writer finished before it could be killed: make it slower"
    assert len(durable) < N
    # what the next writer found after each targeted kill: an unsealed temp file is
    # removed; a sealed shard whose line is missing or torn is adopted, never deleted
    after = dict(zip(points, recoveries[1:]))
    assert after["written"]["temp_files_removed"] == 1 and not after["written"]["adopted"]
    assert after["tmp"]["temp_files_removed"] == 1 and not after["tmp"]["adopted"]
    assert len(after["rename"]["adopted"]) == 1 and len(after["dirsync"]["adopted"]) == 1
    assert after["manifest"]["truncated_manifest_tail"] is True and len(after["manifest"]["adopted"]) == 1
    assert not after["line"]["adopted"] and not after["line"]["truncated_manifest_tail"]
    assert not any(r["quarantined"] or r["lost_rollouts"] for r in recoveries)
    # rerun to completion: only the missing rollouts are written, each exactly once
    w = Writer(out)
    w.finish()
    assert w.proc.returncode == 0 and w.lines[-1] == "done", w.proc.stderr.read()
    assert w.acknowledged().isdisjoint(durable)
    final = check_consistent(out, set())
    assert final == {f"r{i}" for i in range(N)}
    plain = ds.dataset(out / "samples", format="ipc").to_table()
    assert plain.num_rows == N * ROWS_PER_ROLLOUT
    assert not list((out / "samples").glob(".*"))  # no temp files left
