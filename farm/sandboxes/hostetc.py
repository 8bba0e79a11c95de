"""The jail's ``/etc``: the selected host entries staged once in one directory, bound whole.

Every jailed command is a bubblewrap start, and each bind mount is work in its fresh mount
namespace: the ~25 ``/etc`` entries a jail shows (``hostview.ETC_ENTRIES``) bound one by one
were half of a start's CPU (20 -> 10 ms a command measured, ~0.1 s a rollout of ten commands,
more under load). Copied once into a directory and bound as ``/etc`` (with the sandbox's own
``passwd`` and ``group`` over it) they are one bind: the jail sees the same files.

The stage lives in ``/tmp/farm-etc-<uid>/<signature>/`` (0700, beside the forwarded ports'
sockets: no jail sees it but through this bind, read-only), shared by every farm process of
the user on the node whatever its ``base_dir``. The signature is a digest of every staged
entry's path, type, size, mtime and link target, files inside the staged directories
included (and empty ``passwd`` and ``group``, where each sandbox binds its own): when the host
changes one (``resolv.conf``, a CA bundle), the next check makes a new stage. A process looks
at the entries again at most every ``RECHECK_S`` seconds and at every file inside the staged
directories every ``DEEP_RECHECK_S`` (a few hundred stats), so a change reaches new commands
within those; stages are built under a temporary name and
renamed into place (several actors on a node share them) and are never changed after.
Symlinks into what the jail sees (``/usr``, ``/proc``) stay links; others are copied as
the file they point at (bubblewrap's bind of a link showed its target too).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import threading
import time
import uuid
from pathlib import Path

from farm.errors import SandboxError
from farm.sandboxes.hostview import ETC_ENTRIES, VISIBLE_TARGETS

RECHECK_S = 30.0  # the entries themselves (~30 stats)
DEEP_RECHECK_S = 300.0  # every file inside the staged directories too (~500 stats: ~10-80 ms)
MOUNT_POINTS = ("passwd", "group")  # empty here: each sandbox binds its own over them
STAGES = "/tmp/farm-etc-{uid}"
_lock = threading.Lock()


class _Seen:
    """What this process last found for one host /etc."""

    def __init__(self, stage: str, top: str, now: float) -> None:
        self.stage, self.top, self.checked, self.deep_checked = stage, top, now, now


_last: dict[str, _Seen] = {}


def staged_etc(host_etc: str = "/etc", stages: str | None = None) -> str:
    """The stage of ``host_etc``'s selected entries: the one this process found, checked
    against the host's entries every ``RECHECK_S`` s and against every file inside them
    every ``DEEP_RECHECK_S`` s; made when the host changed."""
    now = time.monotonic()
    root = Path(stages or STAGES.format(uid=os.getuid()))
    key = f"{root}\0{host_etc}"
    with _lock:
        seen = _last.get(key)
        if seen is not None and now - seen.checked < RECHECK_S and os.path.isdir(seen.stage):
            return seen.stage
        top = _signature(host_etc, deep=False)
        if (seen is not None and top == seen.top and now - seen.deep_checked < DEEP_RECHECK_S
                and os.path.isdir(seen.stage)):
            seen.checked = now
            return seen.stage
        _last[key] = _Seen(_make(root, host_etc), top, now)
        return _last[key].stage


def _visible_link(path: str) -> str | None:
    """The link's target when the jail can follow it, else None (copy what it points at)."""
    if not os.path.islink(path):
        return None
    return os.readlink(path) if os.path.realpath(path).startswith(VISIBLE_TARGETS) else None


def _signature(host_etc: str, *, deep: bool = True) -> str:
    h = hashlib.sha256()
    for name in ETC_ENTRIES:
        top = os.path.join(host_etc, name)
        for path in [top, *(_inside(top) if deep else ())]:
            try:
                st = os.lstat(path) if _visible_link(path) is not None else os.stat(path)
            except OSError:
                h.update(f"{path}\0missing\n".encode())
                continue
            link = _visible_link(path) or ""
            h.update(f"{path}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{link}\n".encode())
    return h.hexdigest()[:20]


def _inside(top: str) -> list[str]:
    if os.path.islink(top) or not os.path.isdir(top):
        return []
    found = []
    for root, dirs, files in os.walk(top):
        found += [os.path.join(root, n) for n in sorted(dirs + files)]
    return found


def _make(stages: Path, host_etc: str) -> str:
    final = stages / _signature(host_etc)
    if final.is_dir():
        return str(final)
    stages.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = stages.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise SandboxError(f"{stages} is not a private directory of uid {os.getuid()}: remove it")
    tmp = stages / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir(mode=0o755)
    try:
        for name in ETC_ENTRIES:
            _copy(os.path.join(host_etc, name), tmp / name)
        for name in MOUNT_POINTS:
            (tmp / name).touch(mode=0o644)
        try:
            os.rename(tmp, final)
        except OSError:  # another process made the same stage meanwhile
            if not final.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(final)


def _copy(src: str, dest: Path) -> None:
    link = _visible_link(src)
    if link is not None:
        os.symlink(link, dest)
    elif os.path.isdir(src):
        dest.mkdir(mode=0o755)
        for entry in sorted(os.listdir(src)):
            _copy(os.path.join(src, entry), dest / entry)
        shutil.copystat(src, dest)
    elif os.path.isfile(src):
        shutil.copy2(src, dest)  # a link the jail cannot follow: the file it points at
