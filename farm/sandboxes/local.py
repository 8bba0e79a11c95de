"""LocalSandbox: one workspace directory per sandbox, every command under bubblewrap.

Each command runs in its own bwrap jail: own PID, IPC, UTS and user namespaces, an
unprivileged uid (``sandbox.local.uid``) with no capabilities, a minimal view of the
host (``farm.sandboxes.hostview``: no home dirs, project checkout, task files, output
dirs, Ray dirs or other sandboxes), its own /tmp. Network: task setup uses
``setup_network`` (default: the host's, to install packages); after
``isolate_network()`` (the rollout calls it before the agent starts, the grader before
it applies the policy's diff) every command gets its own network namespace with only
its loopback, where ``forward_port`` relays one port to a unix socket the gateway
listens on. All commands of a sandbox share one cgroup (memory, pids) and a watchdog
(disk, lifetime): a breach kills the processes and shows in ``breaches``. When a
command's main process exits, its PID namespace dies with it: nothing is left behind.
``isolation: none`` runs commands directly on the host (explicit opt-in; a warning is
logged): no jail, /tmp is the host's, only the process group is killed. The on-disk
layout is in ``farm.sandboxes.local_dirs``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from farm.errors import SandboxClosed, SandboxError
from farm.sandboxes.base import ClosingContext, ExecResult, SandboxSpec
from farm.sandboxes.bwrap import (
    FirstCommand,
    HostMounts,
    JailStatus,
    bwrap_argv,
    find_host_program,
    forwarder_prefix,
    with_rlimits,
)
from farm.sandboxes.cgroups import SandboxCgroup
from farm.sandboxes.config import LocalSandboxConfig
from farm.sandboxes.hostetc import staged_etc
from farm.sandboxes.hostview import user_files
from farm.sandboxes.local_image import LocalImage
from farm.sandboxes.local_files import LocalFiles
from farm.sandboxes.local_net import LocalNetwork
from farm.sandboxes.local_dirs import (  # noqa: F401 - re-exported: the backend's public names
    LABELS_FILE,
    MARKER_ENV,
    busy_processes,
    reap,
    remove_sandbox_dir,
    safe_component,
    sandbox_pids,
    sandbox_root,
    socket_dir,
)
from farm.sandboxes.process import HostProcess
from farm.sandboxes.usage import CPUBook
from farm.sandboxes.views import mount_view, resolve_mode, unmount_under
from farm.sandboxes.watchdog import COUNTED_FS, Watchdog, fs_type, written_bytes

log = logging.getLogger(__name__)

DEFAULT_MAX_OUTPUT_BYTES = 8 * 1024**2


def _describe(cmd: str | list[str]) -> str:
    text = cmd if isinstance(cmd, str) else shlex.join(cmd)
    return text if len(text) <= 200 else text[:197] + "..."


class LocalSandbox(LocalFiles, LocalNetwork, LocalImage, ClosingContext):
    """A sandbox on this machine. Build with ``await LocalSandbox.create(cfg, spec)``."""

    def __init__(
        self, cfg: LocalSandboxConfig, spec: SandboxSpec, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> None:
        self._cfg = cfg
        self._spec = spec
        self._max_output = max_output_bytes
        self._isolated = cfg.isolation == "bwrap"
        self._bwrap = self._find_bwrap() if self._isolated else None
        self._prlimit = self._find_prlimit()
        self.id = uuid.uuid4().hex[:12]
        self.labels = dict(spec.labels)
        run_id = safe_component(self.labels.get("run_id", "norun"))
        self._base_dir = sandbox_root(cfg)
        self.dir = Path(self._base_dir, run_id, self.id)
        self.root = str(self.dir / "root")
        self.home = str(self.dir / "root" / "home")
        self._tmp_dir = str(self.dir / "tmp")
        self._etc_dir = str(self.dir / "etc")
        self._sock_dir = ""  # made with the dirs (local_dirs.socket_dir)
        self.view_ready_s = 0.0
        self.view_mode = ""  # how its view was made (overlay, fuse-overlayfs, copy)
        self.view = spec.view  # the environment snapshot it starts from (None: an empty root)
        self._view_map: tuple[str, str] | None = None  # (host dir, mount path) once made
        if self.view is not None and not self._isolated:
            raise SandboxError("a sandbox started from an environment snapshot needs sandbox.local.isolation: bwrap")
        self._init_image(cfg.runtime_dir)
        self.tmp = "/tmp" if self._isolated else self._tmp_dir  # TMPDIR as its commands see it
        self._procs: set[HostProcess] = set()
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._net_latched = False  # isolate_network() was called
        self._forwards: list[int] = []
        self._socat: str | None = None
        self._cgroup: SandboxCgroup | None = None
        self.cpu = CPUBook(None)  # counts once the cgroup exists (_make_dirs)
        self.removal_cpu_s = 0.0  # the CPU of the `rm` that removed its directories (a child of farm's process)
        self._host: HostMounts | None = None  # with the dirs (_make_dirs)
        self._watchdog = Watchdog(
            path=str(self.dir),
            extra_paths=[self.view.lower if self.view.writable else self.view.upper]
            if self.view is not None and self.view.building else [],
            disk_bytes=cfg.limits.disk_bytes,
            interval_s=cfg.limits.disk_check_s,
            lifetime_s=spec.timeout_s,
            kill=self._kill_processes,
            busy=lambda: bool(self._procs),  # only a running command (or farm: wrote()) changes the use
            written=self._written_bytes,
            full_interval_s=cfg.limits.disk_full_check_s,
        )
        self._writes_counted = False  # what its processes write is counted (_make_dirs decides)
        self._jail_proven = False  # a command of its ran in its jail (or it has none and `true` ran)
        self._spawned = False  # a command was started (entered its cgroup)

    @classmethod
    async def create(
        cls, cfg: LocalSandboxConfig, spec: SandboxSpec, *, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> LocalSandbox:
        """Make the sandbox's directories (its first command checks that its jail works)."""
        sb = cls(cfg, spec, max_output_bytes=max_output_bytes)
        if not sb._isolated:
            log.warning(
                "sandbox %s: sandbox.local.isolation is 'none': commands run on the host WITHOUT isolation", sb.id
            )
        elif cfg.network == "host":
            log.warning(
                "sandbox %s: sandbox.local.network is 'host': the agent reaches the host network, Ray's ports "
                "and every other rollout's gateway session",
                sb.id,
            )
        try:
            await asyncio.to_thread(sb._make_dirs)
            sb._watchdog.start()
            if not sb._isolated:
                await sb._probe()
        except BaseException:
            await sb.close()
            raise
        return sb

    async def _probe(self) -> None:
        """Run `true`: the jail works, or a SandboxError says why. A jailed sandbox's first
        exec() is its own probe (bwrap's status says whether its jail was made, ``exec``),
        and `true` runs only when it was not: a jail costs ~10 ms of CPU, and three a
        rollout were spent on `true` alone."""
        result = await self._exec(["true"], None, None, 60, None, probe=True)
        if result.exit_code != 0:
            raise SandboxError(
                f"local sandbox cannot run commands (exit {result.exit_code}): {result.stderr.strip()[-2000:]} "
                "(if user namespaces are disabled here, try sandbox.local.unshare_user: false)"
            )
        self._jail_proven = True

    # --- setup ---------------------------------------------------------------
    def _find_bwrap(self) -> str:
        found = find_host_program(self._cfg.bwrap_path)
        if found is None:
            raise SandboxError(
                f"bubblewrap ({self._cfg.bwrap_path!r}) not found: install the 'bubblewrap' package "
                "(apt-get install bubblewrap), or set sandbox.local.isolation: none to run commands "
                "WITHOUT isolation"
            )
        return found

    def _find_prlimit(self) -> str | None:
        found = find_host_program("prlimit")
        if found is None:
            raise SandboxError("prlimit not found (it ships with util-linux): install 'util-linux'")
        return found

    def _make_dirs(self) -> None:
        # The cgroup, then labels.json (atomically, naming the cgroup), then the rest: a
        # crash mid-create leaves an empty directory or one that ``reap`` recognises.
        for attempt in range(3):
            for parent in (self._base_dir, str(self.dir.parent)):
                os.makedirs(parent, mode=0o700, exist_ok=True)
            try:
                self.dir.mkdir(mode=0o700)
                break
            except FileNotFoundError:  # the run's last other sandbox removed the run dir just then (_remove_from_host)
                if attempt == 2:
                    raise
        if self._isolated:
            limits = self._cfg.limits
            self._cgroup = SandboxCgroup.create(
                self.dir.parent.name, self.id, memory_bytes=limits.memory_bytes, pids=limits.pids
            )
            if self._cgroup is not None and self._cgroup.cpu_s() is not None:
                self.cpu = CPUBook(self._cgroup.cpu_s)
            if self._cgroup is None and (limits.memory_bytes or limits.pids):
                log.warning(
                    "sandbox %s: no writable cgroup here: memory is limited per process (RLIMIT_DATA), "
                    "processes per command (RLIMIT_NPROC), not per sandbox",
                    self.id,
                )
        info = {
            "sandbox_id": self.id,
            "labels": self.labels,
            "root": self.root,
            "isolation": self._cfg.isolation,
            "created_at": time.time(),
            "farm_pid": os.getpid(),
            "cgroups": [str(d) for d in self._cgroup.dirs.values()] if self._cgroup else [],
            "sock_dir": str(socket_dir(self.id)) if self._isolated else "",
            "view": self.view.model_dump() if self.view is not None else None,
        }
        self._sock_dir = info["sock_dir"]
        staged = self.dir / f".{LABELS_FILE}.tmp"
        staged.write_text(json.dumps(info, indent=1))
        os.replace(staged, self.dir / LABELS_FILE)
        os.makedirs(self.home)
        os.makedirs(self._tmp_dir)
        os.chmod(self._tmp_dir, 0o1777)
        os.makedirs(self._etc_dir)
        passwd, group = user_files(self._cfg.uid, self.home)
        Path(self._etc_dir, "passwd").write_text(passwd)
        Path(self._etc_dir, "group").write_text(group)
        # here, in a thread: the first stage of /etc copies a few hundred files (an image's
        # mounts need its view: made at its first command)
        if self._isolated and not self.image:
            self._host = self._host_mounts()
        if self.view is not None:  # after labels.json: reap finds (and unmounts) it
            t0 = time.monotonic()
            self.view_mode = resolve_mode(self._cfg.view)
            if self.view.writable:
                host = self.view.lower
            else:
                upper = Path(self.view.upper) if self.view.upper else None
                host = str(mount_view(self.view.layers, self.dir / "view", self.view_mode, upper=upper))
            self._view_map = (host, self.view.mount)
            if self.image:
                self._image_ready(host)
            self.view_ready_s = time.monotonic() - t0
        # the watchdog may trust the processes' write counts only where every write of theirs
        # is counted to them: in their cgroup, on a disk file system, not through a FUSE daemon
        self._writes_counted = (
            self._cgroup is not None
            and self.view_mode != "fuse-overlayfs"
            and all(fs_type(p) in COUNTED_FS for p in self._watchdog.paths)
        )

    # --- commands ------------------------------------------------------------
    def _uid(self, user: str | None) -> int | None:
        ids = self._image_ids(user, self._cfg.unshare_user)
        if ids is not None:
            return ids[0]
        if user is None:
            return self._cfg.uid if self._isolated and self._cfg.unshare_user else None
        if self._isolated and self._cfg.unshare_user:
            if user == "sandbox":
                return self._cfg.uid
            if user == "root":
                return 0
            if user.isdigit():
                return int(user)
            try:
                return pwd.getpwnam(user).pw_uid
            except KeyError:
                raise SandboxError(f"unknown user {user!r}") from None
        if user == pwd.getpwuid(os.getuid()).pw_name:
            return None
        raise SandboxError(f"exec(user={user!r}) needs sandbox.local.isolation: bwrap with unshare_user")

    def _ro_binds(self) -> list[str]:
        """What the sandbox sees of the host beyond the system runtime, read-only: farm's
        own Python environment (tasks run their tests with the interpreter running farm,
        ``tasks.python: auto``), the spec's binds (the harness CLI's package) and config's."""
        binds = [] if self.image else [sys.prefix, sys.base_prefix, *self._spec.ro_binds]  # an image has its own
        binds += [os.path.expanduser(p) for p in self._cfg.ro_binds]
        return [b for b in binds if not _is_under(os.path.realpath(b), self._base_dir)]

    def _host_mounts(self) -> HostMounts:
        if self.image:
            return self._image_mounts(self._ro_binds())
        return HostMounts.of(self._etc_dir, self._ro_binds(), staged_etc())

    # --- limits --------------------------------------------------------------
    @property
    def limits_policy(self) -> dict[str, str]:
        lim = self._cfg.limits
        return {
            "enforced_by": self._cgroup.describe() if self._cgroup else "rlimits (no writable cgroup)",
            "memory_bytes": str(lim.memory_bytes),
            "pids": str(lim.pids),
            "disk_bytes": str(lim.disk_bytes),
            "lifetime_s": f"{self._spec.timeout_s:g}",
        }

    def busy_processes(self) -> int | None:
        """Processes doing work of their own (a tool the agent runs); see ``local_dirs``."""
        return busy_processes(self.id)

    @property
    def breaches(self) -> list[str]:
        """Every limit this sandbox's processes ran into, as precise reasons ([] if none)."""
        # (a cgroup no command ever entered has nothing to say: a pooled sandbox, asked at each take)
        found = self._cgroup.breaches() if self._cgroup is not None and self._spawned else []
        return found + list(self._watchdog.breaches.values())

    async def _kill_processes(self) -> None:
        """Kill every running process of the sandbox (a watchdog breach); the sandbox stays."""
        await asyncio.gather(*(p.kill() for p in list(self._procs)), return_exceptions=True)
        if self._cgroup is not None:
            await asyncio.to_thread(self._cgroup.kill_all)

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {
            "PATH": self._cfg.path,
            "HOME": self.home,
            "TMPDIR": self.tmp,
            "LANG": "C.UTF-8",
            MARKER_ENV: self.id,
        }
        if self.view is not None:
            merged.update(self.view.env)  # a container image's (its Env, activated)
        merged.update(self._spec.env)
        merged.update(env or {})
        return merged

    async def _spawn(
        self,
        cmd: str | list[str],
        cwd: str | None,
        env: Mapping[str, str] | None,
        user: str | None,
        status: JailStatus | None = None,
    ) -> HostProcess:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise SandboxError("exec: empty command")
        workdir = os.path.normpath(os.path.join(self.root, cwd or self.root))
        inner_env = self._env(env)
        prlimit = self._in_jail(self._prlimit) if self._prlimit else None
        limited = with_rlimits(argv, prlimit, self._cfg.limits, memory_per_process=self._cgroup is None) if prlimit else argv
        if self._isolated:
            assert self._bwrap is not None
            isolated = self._net_isolated()
            ports = self._listened_ports() if isolated else []
            if ports:
                assert self._socat is not None
                limited = [*forwarder_prefix(self._in_jail(self._socat), ports, **self._helper_tools()),
                           *limited]  # fmt: skip
            if self._host is None:
                self._host = self._host_mounts()
            full = bwrap_argv(
                bwrap=self._bwrap,
                root=self.root,
                tmp_dir=self._tmp_dir,
                host=self._host,
                sock_dir=self._sock_dir if ports else None,
                cwd=workdir,
                view=self._view_map,
                env=inner_env,
                argv=limited,
                uid=self._uid(user),
                gid=(self._image_ids(user, self._cfg.unshare_user) or (None, None))[1],
                unshare_user=self._cfg.unshare_user,
                unshare_net=isolated,
                status_fd=status.fd if status is not None else None,
            )
            if self._cgroup is not None:
                full = [*self._cgroup.enter_prefix(), *full]
            host_env = {"PATH": self._cfg.path, MARKER_ENV: self.id}
            host_cwd = None
        else:
            self._uid(user)
            full, host_env, host_cwd = limited, inner_env, workdir
        if not self._writes_counted:
            self._watchdog.wrote()
        at = self.cpu.reading()  # before the spawn: the command's whole count is its own
        self._spawned = True
        proc = await HostProcess.spawn(
            full,
            env=host_env,
            cwd=host_cwd,
            describe=_describe(cmd),
            max_output_bytes=self._max_output,
            kill_grace_s=self._cfg.kill_grace_s,
            on_exit=self._exited,
            jailed=self._isolated,
            pass_fds=(status.fd,) if status is not None else (),
        )
        if status is not None:
            status.spawned()
        self._procs.add(proc)
        self._watchdog.wake()  # an idle sandbox's watchdog sleeps until a command starts
        self.cpu.started(proc.pid, proc.describe, at=at)
        return proc

    def _exited(self, proc: HostProcess) -> None:
        self._procs.discard(proc)
        self.cpu.ended(proc.pid)
        self._watchdog.wrote()  # its processes' write counts left with it: the next round sums

    def _written_bytes(self) -> int | None:
        """What the sandbox's live processes have written (for the watchdog); None: not counted."""
        if not self._writes_counted or self._cgroup is None:
            return None
        return written_bytes(self._cgroup.pids_counted())

    async def exec(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = 60.0,
        user: str | None = None,
    ) -> ExecResult:
        return await self._exec(cmd, cwd, env, timeout, user)

    async def _exec(
        self,
        cmd: str | list[str],
        cwd: str | None,
        env: dict[str, str] | None,
        timeout: float | None,
        user: str | None,
        *,
        probe: bool = False,
    ) -> ExecResult:
        proc = await self._launch(cmd, cwd, env, user, probe=probe)
        try:
            result = await proc.wait(timeout)
        finally:
            if proc.running:  # cancelled: never leave the tree behind
                await proc.kill()
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} was closed while {_describe(cmd)!r} ran")
        return result

    async def start(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> HostProcess | FirstCommand:
        return await self._launch(cmd, cwd, env, user)

    async def _launch(
        self, cmd: str | list[str], cwd: str | None, env: dict[str, str] | None, user: str | None, *, probe: bool = False
    ) -> HostProcess | FirstCommand:
        """The command spawned. Until a command has run in the jail, each reports whether the
        jail was made (``FirstCommand``, read when it ends: an exec's or a long one's alike, no
        `true` before it): a jail that could not be (user namespaces disabled, a mount refused)
        is the sandbox's failure (SandboxError), not the command's exit 1. ``probe``: this is
        the `true` that tells, which answers by its own exit code."""
        status = JailStatus() if self._isolated and not self._jail_proven else None
        try:
            proc = await self._spawn(cmd, cwd, env, user, status)
        except BaseException:
            if status is not None:
                status.close()
            raise
        if status is None:
            return proc
        return FirstCommand(proc, status, proven=self._proved, prove=None if probe else self._probe)

    def _proved(self) -> None:
        self._jail_proven = True

    # --- lifecycle -------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        procs = list(self._procs)
        try:
            await self._watchdog.stop()
            results = await asyncio.gather(*(p.kill() for p in procs), return_exceptions=True)
            self.cpu.freeze()
            await asyncio.to_thread(self._remove_from_host)  # one thread job: each costs wake-ups
        finally:
            self._run_close_callbacks()
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise SandboxError(f"sandbox {self.id}: {len(errors)} process(es) could not be killed: {errors[0]}")

    def _remove_from_host(self) -> None:
        """Its cgroup, socket dir, view mount and directories (in that order)."""
        if self._cgroup is not None:
            self._cgroup.remove()
        if self._sock_dir:
            shutil.rmtree(self._sock_dir, True)
        if self._cfg.keep and self.view is not None and not self.view.writable:
            unmount_under(self.dir)  # (a directory removed is unmounted first, by remove_sandbox_dir)
        if not self._cfg.keep and self.dir.exists():
            self.removal_cpu_s += remove_sandbox_dir(self.dir)
            try:
                self.dir.parent.rmdir()  # the run dir, once its last sandbox is gone
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"LocalSandbox(id={self.id!r}, root={self.root!r}, isolation={self._cfg.isolation!r})"


def _is_under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")
