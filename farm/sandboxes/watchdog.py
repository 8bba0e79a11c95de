"""The disk and lifetime watchdog of a local sandbox.

Disk cannot be capped by a cgroup, and a per-file RLIMIT_FSIZE does not stop a thousand
files: so the watchdog sums the allocated blocks under the sandbox's directory
(``os.scandir``, in a thread; hard links counted once, sparse files by what they really
allocate) and, when the sum is over the limit, kills the sandbox's processes and records
the breach. The sandbox's lifetime (``SandboxSpec.timeout_s``) is checked in the same loop,
every ``interval_s``.

A walk costs CPU in proportion to the files, and a sandbox's CLI runs for its whole
rollout, so the rounds do not walk when they can prove the limit is not reached:

- only what writes can change the sum: the sandbox's processes and farm's own file writes
  into it. An idle sandbox (a warm one in the pool, a grading sandbox between commands, an
  agent's after its CLI ended) costs nothing, not even a wake-up: its loop sleeps until a
  command starts or farm writes (``wrote``, ``wake``), or until its lifetime ends; farm's
  writes and a command's end (its processes' counts leave with it) make the next round walk;
- while commands run, a round reads what the sandbox's live processes have written
  (``written``: the kernel's per-process count of the bytes they dirtied, which takes in
  what their reaped children wrote): the sum at the last walk plus what was written since
  is a bound on the use, and only a bound over the limit makes the round walk. What that
  count does not see (blocks ``fallocate`` reserves, directories' own blocks) is summed by
  a walk at least every ``full_interval_s`` while a command runs.

The overshoot is bounded by write speed x ``interval_s`` for data written
(RLIMIT_FSIZE still caps any single file), and by what an allocation without writing
reserved within ``full_interval_s``. Where the counts cannot be read (``written`` gives
None: no cgroup, no task IO accounting), every round of a busy sandbox walks.
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


# File systems whose writes the kernel counts to the writing process when it dirties a page
# (``write_bytes`` in /proc/<pid>/io). Not tmpfs/ramfs (no writeback: never counted), not
# FUSE (the daemon writes, outside the sandbox), not an overlay (its upper layer may be
# either): there, every round of a busy sandbox walks.
COUNTED_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs"})


_FS_OF_DIR: dict[tuple[str, int], str] = {}  # (a directory, its device) -> the type of its file system


def fs_type(path: str) -> str:
    """The type of the file system ``path`` is on (the deepest mount point above it), '' if unknown.

    Reading the mount table costs ~1 ms on a node with many sandboxes' mounts, and every new
    sandbox asks about its own new directory: a path on its parent's device (not a mount
    point) is on its parent's file system, which is remembered (by the parent and its device:
    a file system mounted there since is another device)."""
    path = os.path.realpath(path)
    parent = os.path.dirname(path)
    try:
        dev, parent_dev = os.stat(path).st_dev, os.stat(parent).st_dev
    except OSError:
        return _fs_type(path)
    if dev != parent_dev:  # a mount point itself
        return _fs_type(path)
    key = (parent, parent_dev)
    if key not in _FS_OF_DIR:
        _FS_OF_DIR[key] = _fs_type(parent)
    return _FS_OF_DIR[key]


def _fs_type(path: str) -> str:
    best, kind = "", ""
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                fields = line.split()
                sep = fields.index("-")
                mount = fields[4].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, fields[sep + 1]
    except (OSError, ValueError, IndexError):
        return ""
    return kind


def written_bytes(pids: list[int]) -> int | None:
    """What ``pids`` have written, by the kernel's count of the bytes each process dirtied
    (its threads and its reaped children included); None when a count cannot be read (no
    task IO accounting, no permission). A process that ended since ``pids`` was listed counts
    nothing here: its count went to its parent."""
    total = 0
    for pid in pids:  # read every round of a busy sandbox: no file object, one read
        try:
            fd = os.open(f"/proc/{pid}/io", os.O_RDONLY)
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            return None
        try:
            text = os.read(fd, 4096)
        except ProcessLookupError:  # it ended between the open and the read
            continue
        except OSError:
            return None
        finally:
            os.close(fd)
        start = text.find(b"\nwrite_bytes: ")
        if start < 0:
            return None
        total += int(text[start + 14:text.index(b"\n", start + 1)])
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
        written: Callable[[], int | None] | None = None,
        full_interval_s: float | None = None,
    ) -> None:
        self._path = path
        self.paths = [path, *(extra_paths or [])]
        self._disk_bytes = disk_bytes
        self._interval = interval_s
        self._deadline = time.monotonic() + lifetime_s if lifetime_s else None
        self._lifetime_s = lifetime_s
        self._kill = kill
        self._busy = busy  # None: always sum
        self._written = True  # the first round sums (the directories as made)
        self._count = written or (lambda: None)  # bytes the live processes wrote (None: unknown)
        self._full_interval = full_interval_s if full_interval_s is not None else interval_s
        self._used = 0  # the last walk's sum
        self._walked_at = 0.0  # monotonic time of the last walk
        self._counted = 0  # the processes' count when last read
        self._grown = 0  # what they wrote since the last walk (a bound: a dropped count is not subtracted)
        self.walks = 0  # disk sums done (the cost this module keeps low)
        self.rounds = 0  # rounds run (an idle sandbox's loop runs none)
        self._woken = asyncio.Event()  # a command started or farm wrote: an idle loop goes on
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
        """Something changed the disk use that the processes' counts do not show (farm wrote
        a file, a command ended and its count left with it): the next round sums."""
        self._written = True
        self._woken.set()

    def wake(self) -> None:
        """A command started: rounds run again (every ``interval_s``) while the sandbox is busy."""
        self._woken.set()

    def _idle(self) -> bool:
        """Nothing can change the disk use until a command starts or farm writes."""
        if self._disk_bytes is None:
            return True
        return not self._written and self._busy is not None and not self._busy()

    async def check(self) -> None:
        """One round: lifetime, then disk."""
        self.rounds += 1
        if self._deadline is not None and time.monotonic() > self._deadline and "lifetime" not in self.breaches:
            self.breaches["lifetime"] = f"lifetime: {self._lifetime_s:g} s exceeded: processes killed"
            await self._kill()
        if self._disk_bytes is None:
            return
        busy = self._busy() if self._busy is not None else True
        if not (busy or self._written):
            return
        count = self._count()
        if count is not None and not self._written:
            self._grown += max(0, count - self._counted)
            self._counted = count
            due = time.monotonic() - self._walked_at >= self._full_interval
            if not due and self._used + self._grown <= self._disk_bytes:
                return  # the bound is under the limit: no walk
        # a writer still running keeps the flag when nothing counts its writes: the round
        # after it ends sums what it left
        self._written = busy and count is None
        self._counted, self._grown = (count or 0), 0
        self._walked_at = time.monotonic()
        self.walks += 1
        used = sum([await asyncio.to_thread(disk_usage, p) for p in self.paths])
        self._used = used
        if used > self._disk_bytes:
            self.breaches["disk"] = (
                f"disk: {_size(used)} used, over the {_size(self._disk_bytes)} limit: processes killed"
            )
            await self._kill()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            if self._idle():
                self._woken.clear()
                # only a wake-up (or the lifetime's end) can give this round anything to do
                left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is None or left > 0:
                    try:
                        await asyncio.wait_for(self._woken.wait(), left)
                        continue  # woken: the next round comes an interval later, as for a busy sandbox
                    except TimeoutError:
                        pass  # the lifetime ended while idle: the round below records it
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - a watchdog round must never end the watchdog
                log.exception("sandbox watchdog for %s: check failed", self._path)
