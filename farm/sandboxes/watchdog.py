"""The disk and lifetime watchdog of a local sandbox.

Disk cannot be capped by a cgroup, and a per-file RLIMIT_FSIZE does not stop a thousand
files: so every ``interval_s`` the watchdog sums the allocated blocks under the
sandbox's directory (``os.scandir``, in a thread; hard links counted once, sparse files
by what they really allocate) and, when the sum is over the limit, kills the sandbox's
processes and records the breach. The overshoot is bounded by write speed x interval
(RLIMIT_FSIZE still caps any single file). The sandbox's lifetime (``SandboxSpec.timeout_s``)
is checked in the same loop.

Only what writes can change the sum: the sandbox's processes and farm's own file writes
into it. So a round sums only while a process runs (``busy``), once more after the last
one ends, and after farm wrote (``wrote``); an idle sandbox (a warm one in the pool, a
grading sandbox between commands, an agent's after its CLI ended) costs no walk. The
bound is unchanged: nothing unseen can have written since the last sum.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


def disk_usage(path: str) -> int:
    """Bytes allocated under ``path`` (not following symlinks; hard links once; not
    descending into other file systems: a sandbox's overlay view counts by its upper dir)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    try:
        dev = os.stat(path).st_dev
    except OSError:
        return 0
    stack = [path]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    if key in seen:
                        continue
                    seen.add(key)
                total += st.st_blocks * 512
                if entry.is_dir(follow_symlinks=False) and st.st_dev == dev:
                    stack.append(entry.path)
    return total


def _size(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


class Watchdog:
    """Runs until stopped; calls ``kill`` (kill every process of the sandbox) on a breach."""

    def __init__(
        self,
        *,
        path: str,
        extra_paths: list[str] | None = None,
        disk_bytes: int | None,
        interval_s: float,
        lifetime_s: float | None,
        kill: Callable[[], Awaitable[None]],
        busy: Callable[[], bool] | None = None,
    ) -> None:
        self._path = path
        self._paths = [path, *(extra_paths or [])]
        self._disk_bytes = disk_bytes
        self._interval = interval_s
        self._deadline = time.monotonic() + lifetime_s if lifetime_s else None
        self._lifetime_s = lifetime_s
        self._kill = kill
        self._busy = busy  # None: always sum
        self._written = True  # the first round sums (the directories as made)
        self.walks = 0  # disk sums done (the cost this module keeps low)
        self.breaches: dict[str, str] = {}  # kind -> reason (the latest)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None and (self._disk_bytes is not None or self._deadline is not None):
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def wrote(self) -> None:
        """Something may have changed the disk use (a command started, farm wrote a file):
        the next round sums."""
        self._written = True

    async def check(self) -> None:
        """One round: lifetime, then disk."""
        if self._deadline is not None and time.monotonic() > self._deadline and "lifetime" not in self.breaches:
            self.breaches["lifetime"] = f"lifetime: {self._lifetime_s:g} s exceeded: processes killed"
            await self._kill()
        if self._disk_bytes is None:
            return
        busy = self._busy() if self._busy is not None else True
        if busy or self._written:
            # a writer still running keeps the flag: the round after it ends sums what it left
            self._written = busy
            self.walks += 1
            used = sum([await asyncio.to_thread(disk_usage, p) for p in self._paths])
            if used > self._disk_bytes:
                self.breaches["disk"] = (
                    f"disk: {_size(used)} used, over the {_size(self._disk_bytes)} limit: processes killed"
                )
                await self._kill()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - a watchdog round must never end the watchdog
                log.exception("sandbox watchdog for %s: check failed", self._path)
