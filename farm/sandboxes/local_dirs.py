"""Local sandboxes on disk: their directories, labels, host processes, and ``reap``.

Layout on the host (``base_dir`` from config)::

    <base_dir>/<run_id>/<sandbox_id>/labels.json   who made it, its cgroups (found by ``farm reap``)
    <base_dir>/<run_id>/<sandbox_id>/root/         the only writable host path, bound at the same path
    <base_dir>/<run_id>/<sandbox_id>/root/home/    $HOME
    <base_dir>/<run_id>/<sandbox_id>/tmp/          bound at /tmp (private, persists across commands)
    <base_dir>/<run_id>/<sandbox_id>/etc/          the jail's generated /etc/passwd and /etc/group
    /tmp/farm-sock-<uid>/<sandbox_id>/             forwarded ports' unix sockets (at /run/farm inside;
                                                   short, as AF_UNIX paths are limited to 107 bytes)

``base_dir`` and every run dir are mode 0700: no other host user (and no sandbox: they
are not mounted into any jail) can list them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import stat
from pathlib import Path

from farm.errors import SandboxError
from farm.sandboxes.cgroups import reap_cgroups
from farm.sandboxes.views import unmount_under

log = logging.getLogger(__name__)

SOCKET_ROOT = "/tmp/farm-sock-{uid}"
LABELS_FILE = "labels.json"
MARKER_ENV = "FARM_SANDBOX_ID"


def safe_component(value: str) -> str:
    """A string usable as one path component (run ids become directory names)."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "_", value)
    return "_" if cleaned in ("", ".", "..") else cleaned


def sandbox_root(cfg) -> str:  # noqa: ANN001 - LocalSandboxConfig (no import cycle)
    """``base_dir`` as this host sees it: ``~`` and ``$VARS`` expanded here, on the node that
    creates (or reaps) the sandbox, so one config can give each node its own root."""
    expanded = os.path.expandvars(os.path.expanduser(cfg.base_dir))
    if re.search(r"\$\{?[A-Za-z_]", expanded):
        raise SandboxError(f"sandbox.local.base_dir {cfg.base_dir!r} names an environment variable "
                           f"that is not set on this node ({expanded!r})")
    return os.path.realpath(expanded)


def remove_tree(path: Path) -> None:
    """``shutil.rmtree`` (a symlink removed, never followed), read-only directories made inside
    the sandbox made writable first."""
    def onerror(func, p, _exc_info):  # noqa: ANN001 - shutil's callback signature
        # Read-only directories made inside the sandbox: make them writable, retry once.
        try:
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except FileNotFoundError:
            pass

    shutil.rmtree(path, onerror=onerror)


_RM = shutil.which("rm") or "/bin/rm"


def _remove_trees(paths: list[Path]) -> float:
    """Remove every path (a tree or a file) with ONE ``rm -rf`` process; returns its CPU
    seconds (the kernel's count for the child, from ``wait4``). A sandbox's directories hold
    the hundred-odd files a CLI wrote: Python's tree walk cost farm's process a quarter more
    than the unlinks themselves and held its GIL (the gateway's) between them; ``rm`` does the
    same unlinks in its own process. ``--one-file-system``: never into a mount left there.
    What ``rm`` cannot remove (a read-only directory made inside the sandbox, farm not root)
    the Python walk does (``remove_tree``: it makes such directories writable)."""
    if not paths:
        return 0.0
    argv = [_RM, "-rf", "--one-file-system", "--", *map(str, paths)]
    cpu = 0.0
    try:
        pid = os.posix_spawn(_RM, argv, {"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
        _, status, usage = os.wait4(pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
        if os.waitstatus_to_exitcode(status) == 0:
            return cpu
    except OSError as exc:  # no rm to run: the walk below does it all
        log.debug("rm -rf could not run (%s): removing with the tree walk", exc)
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            remove_tree(path)
        elif os.path.lexists(path):
            path.unlink()
    return cpu


def remove_sandbox_dir(sb_dir: Path) -> float:
    """Remove a sandbox directory with its labels file LAST: a process killed midway
    (an actor dying while it closes a sandbox) leaves a directory ``reap`` still
    recognises as the run's, never an unlabelled remnant it must leave alone. An
    environment view still mounted there is unmounted first (never deleted through).
    Returns the CPU seconds of the ``rm`` it ran (``_remove_trees``): farm's, out of its process."""

    unmount_under(sb_dir)
    cpu = _remove_trees([child for child in sb_dir.iterdir() if child.name != LABELS_FILE])
    remove_tree(sb_dir)
    return cpu


def socket_dir(sandbox_id: str) -> Path:
    """The sandbox's (new, private) dir for forwarded ports' unix sockets."""
    root = Path(SOCKET_ROOT.format(uid=os.getuid()))
    root.mkdir(mode=0o700, exist_ok=True)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SandboxError(f"{root} is not a private directory of uid {os.getuid()}: remove it")
    path = root / sandbox_id
    path.mkdir(mode=0o700)
    return path


def sandbox_pids(sandbox_id: str) -> list[int]:
    """Host pids of processes carrying this sandbox's marker in their environment."""
    marker = f"{MARKER_ENV}={sandbox_id}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                if marker in fh.read().split(b"\0"):
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


FARM_COMMS = frozenset({"bwrap", "socat"})  # farm's own processes in a sandbox (jail, port relay)


def _stat(pid: int) -> tuple[str, int] | None:
    """(command name, parent pid) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            head, _, rest = fh.read().rpartition(")")
        return head.split("(", 1)[1], int(rest.split()[1])
    except (OSError, IndexError, ValueError):
        return None


def busy_processes(sandbox_id: str) -> int:
    """Processes of the sandbox doing work of their own: every one carrying its marker
    except farm's (bwrap, socat) and the commands farm started (a bwrap's direct child:
    the agent CLI, a probe). So a tool the agent runs, and whatever it starts, count."""
    busy = 0
    for pid in sandbox_pids(sandbox_id):
        me = _stat(pid)
        if me is None or me[0] in FARM_COMMS:
            continue
        parent = _stat(me[1])
        if parent is not None and parent[0] != "bwrap":
            busy += 1
    return busy


async def reap(run_id: str, *, cfg) -> list[str]:  # noqa: ANN001 - LocalSandboxConfig (no import cycle)
    """Kill every process of every local sandbox labelled ``run_id``, remove its cgroups and dirs."""
    run_dir = Path(sandbox_root(cfg), safe_component(run_id))
    if not run_dir.is_dir():
        return []
    reaped = []
    for sb_dir in sorted(p for p in run_dir.iterdir() if p.is_dir()):
        try:
            info = json.loads((sb_dir / LABELS_FILE).read_text())
        except (OSError, ValueError):
            # A sandbox killed mid-create (before its labels landed) ran no process yet.
            if {p.name for p in sb_dir.iterdir()} <= {f".{LABELS_FILE}.tmp"}:
                await asyncio.to_thread(remove_tree, sb_dir)
            else:  # anything else without labels is not ours: leave it alone, but say so
                log.warning("reap %s: %s has no readable %s; left in place", run_id, sb_dir, LABELS_FILE)
            continue
        if info.get("labels", {}).get("run_id", "norun") != run_id:
            continue
        sandbox_id = str(info["sandbox_id"])
        for pid in sandbox_pids(sandbox_id):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        await asyncio.to_thread(reap_cgroups, list(info.get("cgroups", [])))
        if info.get("sock_dir"):
            await asyncio.to_thread(shutil.rmtree, info["sock_dir"], True)
        await asyncio.to_thread(remove_sandbox_dir, sb_dir)
        reaped.append(sandbox_id)
    try:
        run_dir.rmdir()
    except OSError:
        pass
    return reaped
