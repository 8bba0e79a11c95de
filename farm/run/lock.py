"""One owner per run: an exclusive lock on the output directory, taken before anything else.

``farm run`` takes it first (before Ray, before any reaping): a second invocation with
the same output directory fails fast, naming the live one, and touches nothing. With
the lock held, whatever an earlier invocation left (sandboxes, shards in flight) is
proven ownerless: that invocation is dead (the kernel drops a ``flock`` with its holder).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from farm.errors import FarmError

LOCK_FILE = ".farm-run.lock"


class RunLocked(FarmError):
    """Another live invocation owns this run's output directory."""


class RunLock:
    def __init__(self, out_dir: Path, run_id: str) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self.run_id = run_id
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(self.path)
            os.close(fd)
            raise RunLocked(
                f"run {self.run_id!r} is already running ({holder}); output dir {self.path.parent} "
                "is its own until it ends (stop it first, or use another output.dir)"
            ) from None
        info = {
            "run_id": self.run_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": time.time(),
            "ray_job_id": os.environ.get("RAY_JOB_ID") or os.environ.get("RAY_JOB_SUBMISSION_ID", ""),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _describe(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return "holder unknown"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("started_at", 0)))
    job = f", ray job {info['ray_job_id']}" if info.get("ray_job_id") else ""
    return f"pid {info.get('pid', '?')} on host {info.get('host', '?')} since {since}{job}"
