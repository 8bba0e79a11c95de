"""Command lines for the local backend: the bubblewrap jail and the rlimits (pure); the pipe
bwrap reports its jail on (and a first long command read through it when it ends), and where
the host's programs for them are.

Mount order matters (later mounts cover earlier ones), on bwrap's empty tmpfs root:
  1. the minimal host view (``farm.sandboxes.hostview``: system runtime, selected /etc,
     generated passwd/group, fresh /proc and /dev, tmpfs /run);
  2. the sandbox's own tmp dir at ``/tmp`` (private, persists across its commands);
  3. requested read-only binds (farm's Python, the harness CLI, config), same path;
  4. the forwarded ports' socket dir at /run/farm (read-only: the sockets are the host's);
  5. the sandbox's root read-write at the same path (paths are identical in and out);
  6. its environment view (``farm.sandboxes.views``) read-write at the path it was built at.

A container image's view is the root itself (mounted first, then /proc and /dev; the host's
system is not shown; the relinked host programs at ``/.farm/rt``; nothing remounted
read-only: the view's upper is the sandbox's own).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from farm.sandboxes.config import LocalLimits
from farm.sandboxes.hostrt import RT_MOUNT
from farm.sandboxes.hostview import ro_bind_mounts, system_mounts

FORWARD_DIR = "/run/farm"  # where forwarded ports' unix sockets appear inside the jail


@dataclass(frozen=True)
class HostMounts:
    """What of the host a sandbox's jails see: the system runtime and /etc
    (``hostview.system_mounts``; ``staged_etc``: its entries staged in one directory) and the
    read-only binds. Worked out once per sandbox, when it is made: it stats and resolves ~40
    host paths (~0.6 ms, per command before)."""

    system: tuple[str, ...]
    ro: tuple[str, ...]

    @classmethod
    def of(cls, etc_dir: str, ro_binds: Sequence[str], staged_etc: str | None = None) -> HostMounts:
        return cls(tuple(system_mounts(etc_dir, staged_etc)), tuple(ro_bind_mounts(ro_binds)))

    @classmethod
    def of_image(cls, runtime_dir: str, etc: Sequence[str], ro_binds: Sequence[str]) -> HostMounts:
        """A container image's jail: the image is the system; the host gives farm's relinked
        programs (``hostrt``) and the name-resolution files ``etc`` names (as docker does)."""
        system = ["--ro-bind", runtime_dir, RT_MOUNT]
        for path in etc:
            system += ["--ro-bind-try", path, path]
        return cls(tuple(system), tuple(ro_bind_mounts(ro_binds)))


def _rlimits(limits: LocalLimits, memory_per_process: bool) -> list[tuple[str, int]]:
    """(prlimit's name, value) of each per-process limit set, RLIMIT_CORE 0 last.
    ``memory_per_process``: no cgroup holds the sandbox's memory, so ``memory_bytes``
    becomes each process's RLIMIT_DATA (the weaker fallback)."""
    pairs = (
        ("data", limits.memory_bytes if memory_per_process else None),
        ("nofile", limits.nofile),
        ("nproc", limits.nproc),
        ("fsize", limits.file_size_bytes),
        ("cpu", limits.cpu_seconds),
    )
    return [(name, value) for name, value in pairs if value is not None] + [("core", 0)]


def prlimit_prefix(prlimit: str, limits: LocalLimits, *, memory_per_process: bool) -> list[str]:
    """``prlimit --nofile=N:N ... --`` for the configured per-process limits (soft = hard)."""
    return [prlimit, *(f"--{name}={value}:{value}" for name, value in _rlimits(limits, memory_per_process)), "--"]


# bash's ulimit options for prlimit's names, and the unit of each (bash counts data and file
# sizes in KiB: rounded down, a limit never looser than configured)
_ULIMIT = {"data": ("-d", 1024), "nofile": ("-n", 1), "nproc": ("-u", 1), "fsize": ("-f", 1024), "cpu": ("-t", 1),
           "core": ("-c", 1)}
_BASH = ("bash", "/bin/bash", "/usr/bin/bash")


def with_rlimits(argv: list[str], prlimit: str, limits: LocalLimits, *, memory_per_process: bool) -> list[str]:
    """``argv`` under the configured per-process limits (soft = hard). A ``bash -c`` script
    (every command farm runs itself, the CLI's launch included) sets them with bash's own
    ``ulimit`` as its first line: the same limits without prlimit's exec, about a millisecond
    of CPU a command. Anything else runs under ``prlimit`` (``prlimit_prefix``). Either way
    they are set inside the jail, where RLIMIT_NPROC counts the jail's own user namespace."""
    if len(argv) >= 3 and argv[0] in _BASH and argv[1] == "-c":
        opts = [f"{_ULIMIT[name][0]} {value // _ULIMIT[name][1]}" for name, value in _rlimits(limits, memory_per_process)]
        return [argv[0], "-c", f"ulimit {' '.join(opts)} || exit 1\n{argv[2]}", *argv[3:]]
    return [*prlimit_prefix(prlimit, limits, memory_per_process=memory_per_process), *argv]


def bwrap_argv(
    *,
    bwrap: str,
    root: str,
    tmp_dir: str,
    host: HostMounts,
    sock_dir: str | None,
    cwd: str,
    view: tuple[str, str] | None = None,
    env: Mapping[str, str],
    argv: Sequence[str],
    uid: int | None,
    unshare_user: bool,
    unshare_net: bool,
    gid: int | None = None,
    status_fd: int | None = None,
) -> list[str]:
    """The full bwrap command running ``argv`` (already wrapped in the rlimit prefix). A
    ``view`` mounted at ``/`` (a container image) is the jail's root instead of bwrap's empty
    tmpfs: the host's system is not shown, the root stays writable (the view's upper is the
    sandbox's own), and ``host.system`` holds what the host adds to it. ``status_fd``: bwrap
    writes its JSON status there (an ``exit-code`` line only once the jail was made and the
    command ran; the command itself does not see the fd)."""
    image = view is not None and view[1] == "/"
    args = [
        bwrap,
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "farm-sandbox",
    ]
    if unshare_user:
        args += ["--unshare-user"]
        if uid is not None:
            args += ["--uid", str(uid), "--gid", str(uid if gid is None else gid)]
    if unshare_net:
        args += ["--unshare-net"]
    if status_fd is not None:
        args += ["--json-status-fd", str(status_fd)]
    # When farm runs as root, bwrap would keep every capability in the sandbox.
    args += ["--cap-drop", "ALL"]
    if image:
        assert view is not None
        args += ["--bind", view[0], "/", "--proc", "/proc", "--dev", "/dev"]
    args += host.system
    args += ["--bind", tmp_dir, "/tmp"]
    args += host.ro
    if sock_dir is not None:
        args += ["--ro-bind", sock_dir, FORWARD_DIR]
    args += ["--bind", root, root]
    if view is not None and not image:
        args += ["--bind", view[0], view[1]]
    if not image:  # bwrap's root is a tmpfs: read-only, so nothing outside root, /tmp and /run is writable.
        args += ["--remount-ro", "/"]
    args += ["--chdir", cwd, "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return [*args, "--", *argv]


def forwarder_prefix(socat: str, ports: Sequence[int], *, grep: str = "grep", sleep: str = "sleep") -> list[str]:
    """Run inside the jail before the command: one socat per forwarded port, listening on
    the jail's own loopback and relaying to the unix socket bound at FORWARD_DIR. The
    command starts once every listener is up (seen in /proc/net/tcp, so no probe
    connection reaches the gateway); the socats die with the command's PID namespace."""
    lines = []
    for port in ports:
        sock = f"{FORWARD_DIR}/port-{port}.sock"
        lines.append(
            f"{socat} TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr UNIX-CONNECT:{sock} </dev/null >/dev/null 2>&1 &"
        )
    for port in ports:
        hex_port = f"{port:04X}"
        lines.append(
            f"i=0; until {grep} -q ' 0100007F:{hex_port} 00000000:0000 0A' /proc/net/tcp; do "
            f"i=$((i+1)); [ $i -gt 500 ] && {{ echo 'farm: port forwarder {port} did not start' >&2; exit 125; }}; "
            f"{sleep} 0.01; done"
        )
    lines.append('exec "$@"')
    return ["/bin/sh", "-c", "\n".join(lines), "farm-forward"]


class JailStatus:
    """A pipe for bwrap's ``--json-status-fd``: it says whether the jail was made. bwrap
    writes ``exit-code`` only once its namespaces and mounts were made and the command ran;
    a jail that could not be made (user namespaces disabled, a mount refused) exits 1
    without it. Read after the command exited: bwrap wrote before it exited, so the read
    does not wait."""

    def __init__(self) -> None:
        self._read_end, self.fd = os.pipe()  # self.fd: the end the command inherits
        os.set_blocking(self._read_end, False)

    def spawned(self) -> None:
        """The command holds its own copy now: close ours (else the pipe never ends)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def jail_made(self) -> bool:
        data = b""
        try:
            while chunk := os.read(self._read_end, 4096):
                data += chunk
        except BlockingIOError:
            pass
        return b'"exit-code"' in data

    def close(self) -> None:
        self.spawned()
        if self._read_end >= 0:
            os.close(self._read_end)
            self._read_end = -1


class FirstCommand:
    """A command started before any command proved the sandbox's jail (an exec's or a long
    one's, ``start``): when it ends by itself, its jail's status is read, and a jail that was
    not made is ``prove``'s error (``SandboxError``), not the command's exit 1 (``prove``
    None: the caller tells, by the exit code). So the jail needs no `true` of its own before
    it (a jail's start, ~7 ms of CPU): a rollout's CLI can be its sandbox's first command. A
    kill says nothing of the jail. The rest is the process's (``BackgroundProcess``)."""

    def __init__(self, proc: Any, status: JailStatus, *, proven: Callable[[], None],
                 prove: Callable[[], Awaitable[None]] | None) -> None:
        self._proc, self._proven, self._prove = proc, proven, prove
        self._status: JailStatus | None = status  # None once read (or the process killed)

    async def wait(self, timeout: float | None = None) -> Any:
        try:
            result = await self._proc.wait(timeout)
        except BaseException:  # timed out (killed), cancelled
            self._close()
            raise
        status, self._status = self._status, None
        if status is not None:
            made = status.jail_made() if result.exit_code >= 0 else None
            status.close()
            if made:
                self._proven()
            elif made is False and self._prove is not None:
                await self._prove()  # its jail, or its own part of it (a cwd not there)? `true` tells
        return result

    async def kill(self) -> None:
        try:
            await self._proc.kill()
        finally:
            self._close()

    def _close(self) -> None:
        if self._status is not None:
            self._status.close()
            self._status = None

    def __getattr__(self, name: str) -> Any:  # pid, running, describe
        return getattr(self._proc, name)


_FOUND: dict[tuple[str, str], str] = {}


def find_host_program(name: str) -> str | None:
    """``shutil.which`` on the host's PATH, remembered once found: making a sandbox looked
    for bwrap and prlimit along PATH (a stat a directory each) every time."""
    key = (name, os.environ.get("PATH", os.defpath))
    if key not in _FOUND:
        found = shutil.which(name)
        if found is None:
            return None
        _FOUND[key] = found
    return _FOUND[key]
