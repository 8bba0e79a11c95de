"""What a local sandbox's processes cost the node's CPU, from its cgroup's own count.

A sandbox's cgroup counts the CPU of every process its commands start (the jail, the
command, whatever it forks, processes that already exited included: the kernel's own
count, ``SandboxCgroup.cpu_s``). ``CPUBook`` keeps that total and, per command, what
the count grew by while the command ran. Where no other command of the sandbox ran
meanwhile (``alone``), that growth is the command's own CPU (its jail included); where
commands overlapped, each is marked and the growth is what they used together.

Commands of one sandbox mostly run one after another (the grader's, the workspace's, the
capture), so the figures are per command in practice; the agent CLI's command overlaps
only the harness's occasional gateway probe. Read by ``scripts/bench_density.py`` (the
node's CPU by owner).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

_KEEP_COMMANDS = 256  # a sandbox serving many commands (farm serve) keeps its last ones


@dataclass(frozen=True)
class CommandCPU:
    """One finished command: what the sandbox's CPU count grew by while it ran."""

    key: int  # the command's number in its sandbox (what ``running`` called it)
    describe: str
    cpu_s: float
    alone: bool  # no other command of the sandbox ran meanwhile: cpu_s is this command's own


class _Running:
    __slots__ = ("key", "describe", "pid", "start", "alone")

    def __init__(self, key: int, describe: str, pid: int, start: float, alone: bool) -> None:
        self.key, self.describe, self.pid, self.start, self.alone = key, describe, pid, start, alone


class CPUBook:
    """The CPU count of one sandbox: its total, and per command (see the module doc)."""

    def __init__(self, read: Callable[[], float | None] | None) -> None:
        self._read = read
        self._final: float | None = None
        self._running: dict[int, _Running] = {}  # by the process's host pid
        self._count = 0
        self.commands: deque[CommandCPU] = deque(maxlen=_KEEP_COMMANDS)

    @property
    def counted(self) -> bool:
        """Whether this sandbox's CPU is known (a cgroup that counts it)."""
        return self._read is not None and (self._final is not None or self._read() is not None)

    def total_s(self) -> float | None:
        """CPU used so far by every process of the sandbox (after ``freeze``: at its close)."""
        if self._final is not None or self._read is None:
            return self._final
        return self._read()

    def reading(self) -> float | None:
        """The count now (to pass to ``started`` as ``at``)."""
        return None if self._read is None else self._read()

    def started(self, pid: int, describe: str, *, at: float | None = None) -> None:
        """A command's process ``pid`` (on the host) started; ``at``: the count read just
        before it was spawned (its jail's start and first work run while the spawn returns,
        longer on a busy event loop: read after, they would be no command's)."""
        if self._read is None:
            return
        now = self._read() if at is None else at
        if now is None:
            return
        alone = not self._running
        for other in self._running.values():
            other.alone = False
        self._count += 1
        self._running[pid] = _Running(self._count, describe, pid, now, alone)

    def ended(self, pid: int) -> None:
        run = self._running.pop(pid, None)
        if run is None or self._read is None:
            return
        now = self._read()
        if now is not None:
            self.commands.append(CommandCPU(run.key, run.describe, max(0.0, now - run.start), run.alone))

    def running(self) -> list[tuple[int, str, int]]:
        """(key, describe, host pid) of every command running now."""
        return [(r.key, r.describe, r.pid) for r in self._running.values()]

    def freeze(self) -> None:
        """Keep the total as it is now (the cgroup is about to go)."""
        if self._read is not None and self._final is None:
            self._final = self._read()
