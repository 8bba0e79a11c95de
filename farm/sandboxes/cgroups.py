"""One cgroup per local sandbox: memory and process limits over its whole process tree.

Every command of a sandbox enters the sandbox's cgroup before bubblewrap starts (a tiny
``sh`` wrapper writes its own pid into ``cgroup.procs`` and execs; no ``preexec_fn``:
the host process is a multithreaded Ray actor), so everything the command forks is
counted together, whatever it does with sessions or namespaces.

cgroup v2 is used where the memory and pids controllers can be enabled below this
process's own cgroup; else cgroup v1 (``memory`` and ``pids`` hierarchies, writable on
many container hosts); else nothing (the sandbox then falls back to per-process rlimits
and says so in ``limits_policy``).

The cgroup also counts the CPU its processes use (:meth:`SandboxCgroup.cpu_s`, the
kernel's own nanosecond count, processes that already exited included): v2's
``cpu.stat`` is there in every cgroup; v1 adds a ``cpuacct`` dir when that hierarchy is
mounted and writable (else the CPU is not known: ``None``). Nothing is limited by it. Sandbox cgroups nest below this process's own cgroup
(so the host's limits on farm still hold) as ``farm/<run>/<sandbox>``; their absolute
paths are kept in the sandbox's labels file so ``reap`` can remove them.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_path(controller: str) -> str | None:
    """This process's cgroup path in ``controller``'s v1 hierarchy ('' = v2 unified)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    return None


@functools.cache
def _v2_mount() -> Path | None:
    """Where the cgroup2 hierarchy is mounted (/sys/fs/cgroup, or .../unified in hybrid mode).
    Read once a process: reading the mount table costs ~1 ms on a node with many sandboxes'
    mounts, and the hierarchy's mount point does not move."""
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split()[4])
    except OSError:
        pass
    return None


def _read_bytes(path: str) -> bytes:
    """A small kernel file's bytes (b"" if unreadable), without a file object's set-up."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 1 << 20)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _read_int(path: Path, key: str | None = None) -> int:
    try:
        text = path.read_text()
    except OSError:
        return 0
    if key is None:
        return int(text.strip() or 0)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


@dataclass
class SandboxCgroup:
    """The cgroup dirs of one sandbox (one per v1 controller, or one v2 dir)."""

    version: int
    dirs: dict[str, Path]  # controller name ("memory", "pids", or "unified") -> dir
    memory_bytes: int | None
    pids: int | None
    _removed: bool = field(default=False, repr=False)

    # --- making ---------------------------------------------------------------
    @classmethod
    def create(cls, run: str, sandbox: str, *, memory_bytes: int | None, pids: int | None) -> SandboxCgroup | None:
        """A new cgroup with the limits set, or None when no cgroup is writable here."""
        for make in (cls._create_v2, cls._create_v1):
            try:
                made = make(run, sandbox, memory_bytes, pids)
            except OSError as exc:
                log.debug("cgroup v%s unavailable: %s", "2" if make is cls._create_v2 else "1", exc)
                continue
            if made is not None:
                return made
        return None

    @classmethod
    def _create_v2(cls, run: str, sandbox: str, memory_bytes: int | None, pids: int | None) -> SandboxCgroup | None:
        own, mount = _own_path(""), _v2_mount()
        base = mount / own.lstrip("/") if own is not None and mount is not None else None
        if base is None or not (base / "cgroup.controllers").exists():
            return None
        if not {"memory", "pids"} <= set((base / "cgroup.controllers").read_text().split()):
            return None
        farm_dir = base / "farm"
        farm_dir.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text("+memory +pids")  # EBUSY if base has processes
        (farm_dir / "cgroup.subtree_control").write_text("+memory +pids")
        run_dir = farm_dir / run
        run_dir.mkdir(exist_ok=True)
        (run_dir / "cgroup.subtree_control").write_text("+memory +pids")
        cg_dir = run_dir / sandbox
        cg_dir.mkdir()
        cg = cls(2, {"unified": cg_dir}, memory_bytes, pids)
        if memory_bytes is not None:
            (cg_dir / "memory.max").write_text(str(memory_bytes))
            (cg_dir / "memory.swap.max").exists() and (cg_dir / "memory.swap.max").write_text("0")
        if pids is not None:
            (cg_dir / "pids.max").write_text(str(pids))
        return cg

    @classmethod
    def _create_v1(cls, run: str, sandbox: str, memory_bytes: int | None, pids: int | None) -> SandboxCgroup | None:
        dirs: dict[str, Path] = {}
        try:
            for ctrl in ("memory", "pids"):
                own = _own_path(ctrl)
                if own is None or not (CGROUP_ROOT / ctrl / "cgroup.procs").exists():
                    return None
                d = CGROUP_ROOT / ctrl / own.lstrip("/") / "farm" / run / sandbox
                d.mkdir(parents=True)
                dirs[ctrl] = d
            if memory_bytes is not None:
                (dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                memsw = dirs["memory"] / "memory.memsw.limit_in_bytes"
                if memsw.exists():  # no escaping the limit into swap
                    memsw.write_text(str(memory_bytes))
            if pids is not None:
                (dirs["pids"] / "pids.max").write_text(str(pids))
            acct = _own_path("cpuacct")  # counting only; a sandbox without it still has its limits
            acct_dir = CGROUP_ROOT / "cpuacct" / (acct or "").lstrip("/") / "farm" / run / sandbox
            if acct is not None and (CGROUP_ROOT / "cpuacct" / "cgroup.procs").exists():
                try:
                    acct_dir.mkdir(parents=True)
                    dirs["cpuacct"] = acct_dir
                except OSError as exc:
                    log.debug("cgroup v1 cpuacct unavailable: %s", exc)
        except OSError:
            for d in dirs.values():
                _rmdir_quiet(d)
            raise
        return cls(1, dirs, memory_bytes, pids)

    # --- using ----------------------------------------------------------------
    @functools.cached_property
    def procs_files(self) -> list[str]:  # (read by every spawn and every watchdog round: made once)
        return [str(d / "cgroup.procs") for d in self.dirs.values()]

    def enter_prefix(self) -> list[str]:
        """argv prefix that moves the command into the cgroup, then execs it."""
        writes = " && ".join(f"echo $$ > {f}" for f in self.procs_files)
        return ["/bin/sh", "-c", f'{{ {writes}; }} || exit 125; exec "$@"', "farm-cgroup"]

    def pids_counted(self) -> list[int]:
        """The sandbox's processes from one controller's list (every command enters all of them
        before it execs): what the disk watchdog reads each round, at a third of the reads."""
        return [int(x) for x in _read_bytes(self.procs_files[0]).split()]

    def pids_inside(self) -> list[int]:
        found: set[int] = set()
        for f in self.procs_files:
            try:
                found.update(int(x) for x in Path(f).read_text().split())
            except OSError:
                continue
        return sorted(found)

    def cpu_s(self) -> float | None:
        """CPU time (user + system) every process of the sandbox has used so far, those that
        exited included; None where this cgroup does not count it (v1 without cpuacct)."""
        if self.version == 2:
            usec = _read_int(self.dirs["unified"] / "cpu.stat", "usage_usec")
            return usec / 1e6
        if "cpuacct" not in self.dirs:
            return None
        return _read_int(self.dirs["cpuacct"] / "cpuacct.usage") / 1e9

    def breaches(self) -> list[str]:
        """Each limit the sandbox's processes ran into, as a precise reason."""
        out = []
        if self.version == 1:
            mem, pid = self.dirs["memory"], self.dirs["pids"]
            kills = _read_int(mem / "memory.oom_control", "oom_kill")
            refused = _read_int(pid / "pids.events", "max")
        else:
            d = self.dirs["unified"]
            kills = _read_int(d / "memory.events", "oom_kill")
            refused = _read_int(d / "pids.events", "max")
        if kills and self.memory_bytes is not None:
            out.append(
                f"memory: processes exceeded the {_gib(self.memory_bytes)} limit and were OOM-killed "
                f"({kills} kill{'s' if kills != 1 else ''})"
            )
        if refused and self.pids is not None:
            out.append(f"pids: the {self.pids}-process limit was hit (fork refused {refused} times)")
        return out

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the cgroup until it is empty (forks race the kill)."""
        kill_file = self.dirs.get("unified", Path("/nonexistent")) / "cgroup.kill"
        deadline = time.monotonic() + timeout_s
        while (pids := self.pids_inside()) and time.monotonic() < deadline:
            if kill_file.exists():
                try:
                    kill_file.write_text("1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        """Kill what is left and remove the cgroup dirs (and empty parents up to farm/)."""
        if self._removed:
            return
        self.kill_all()
        for d in self.dirs.values():
            remove_cgroup_dir(d)
        self._removed = True

    def describe(self) -> str:
        return f"cgroup v{self.version}"


def _rmdir_quiet(d: Path) -> None:
    try:
        d.rmdir()
    except OSError:
        pass


def remove_cgroup_dir(d: Path, timeout_s: float = 5.0) -> bool:
    """rmdir a sandbox cgroup (it empties asynchronously after the kill), then its run dir."""
    deadline = time.monotonic() + timeout_s
    while d.exists():
        try:
            d.rmdir()
        except FileNotFoundError:
            break
        except OSError:
            if time.monotonic() > deadline:
                log.warning("cgroup %s could not be removed", d)
                return False
            time.sleep(0.05)
    _rmdir_quiet(d.parent)  # the run's dir, once its last sandbox is gone
    return True


def reap_cgroups(dirs: list[str]) -> None:
    """Kill every process in these cgroup dirs and remove them (``farm reap``)."""
    for raw in dirs:
        d = Path(raw)
        procs = d / "cgroup.procs"
        for _ in range(100):
            try:
                pids = [int(x) for x in procs.read_text().split()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        remove_cgroup_dir(d)
