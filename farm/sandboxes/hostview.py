"""The minimal host a local sandbox sees: bubblewrap mount arguments (pure).

A coding agent legitimately needs the system runtime, a few ``/etc`` files, the harness
CLI with its runtime, farm's Python (tasks run their tests with it when
``tasks.python: auto``), and its own workspace, home and tmp. Everything else of the
host (home directories, the project checkout, task files with their gold patches, the
output directory, ``~/.ray`` and Ray's session dirs, other sandboxes) simply does not
exist in the jail: bwrap starts from an empty tmpfs root and only what is listed here is
mounted into it.

The set was worked out by running the three CLIs (Claude Code, Codex, OpenCode), git,
python venv + pip installs and the demo tasks' tests in the jail.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from farm.errors import SandboxError

# Top-level system dirs: on merged-/usr Debian these are symlinks into /usr (recreated
# as symlinks); elsewhere they are real dirs (bound read-only).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

# /etc entries the runtime needs: name resolution (also for setup's package installs),
# TLS roots, the dynamic loader, alternatives (python3/node/editor links), time zone,
# shell start-up files, git's and pip's/npm's system config (registry mirrors).
ETC_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "gai.conf",
    "gitconfig",
    "host.conf",
    "hosts",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "mime.types",
    "mtab",
    "networks",
    "npmrc",
    "nsswitch.conf",
    "os-release",
    "pip.conf",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "resolv.conf",
    "services",
    "shells",
    "ssl",
    "terminfo",
    "timezone",
)

# Targets a symlink may keep pointing at (they exist in the jail too).
VISIBLE_TARGETS = ("/usr/", "/proc/")


def user_files(uid: int, home: str) -> tuple[str, str]:
    """``/etc/passwd`` and ``/etc/group`` for the jail: root and the sandbox user only."""
    passwd = f"root:x:0:0:root:/root:/bin/bash\nsandbox:x:{uid}:{uid}:sandbox:{home}:/bin/bash\n"
    passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    group = f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n"
    return passwd, group


def _link_or_bind(path: str) -> list[str]:
    if os.path.islink(path):
        target = os.readlink(path)
        resolved = os.path.realpath(path)
        if resolved.startswith(VISIBLE_TARGETS):
            return ["--symlink", target, path]
    if os.path.exists(path):
        return ["--ro-bind", path, path]
    return []


def system_mounts(etc_dir: str, staged_etc: str | None = None) -> list[str]:
    """Mounts of the system runtime, /etc (selected entries + ``etc_dir``'s passwd/group),
    fresh /proc and /dev, tmpfs /run; no host /sys, no host /var. ``staged_etc``: the
    selected entries copied into one directory (``farm.sandboxes.hostetc``), bound whole;
    else each entry is bound from the host on its own."""
    args: list[str] = []
    for path in SYSTEM_DIRS:
        args += _link_or_bind(path)
    if staged_etc is not None:
        args += ["--ro-bind", staged_etc, "/etc"]
    else:
        args += ["--dir", "/etc"]
        for name in ETC_ENTRIES:
            args += _link_or_bind(f"/etc/{name}")
    args += ["--ro-bind", f"{etc_dir}/passwd", "/etc/passwd", "--ro-bind", f"{etc_dir}/group", "/etc/group"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run", "--dir", "/var"]
    args += ["--symlink", "/tmp", "/var/tmp"]
    return args


def ro_bind_mounts(paths: Sequence[str]) -> list[str]:
    """Explicitly requested host paths (farm's Python, the harness CLI, config), read-only
    at the same path; a symlinked path is shown at both its own and its real location."""
    args: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        for path in (os.path.abspath(raw), os.path.realpath(raw)):
            if path in seen or path == "/":
                continue
            seen.add(path)
            if os.path.islink(path):
                args += ["--symlink", os.path.realpath(path), path]
            else:
                args += ["--ro-bind-try", path, path]
    return args


@dataclass(frozen=True)
class ImageUser:
    """Who a container image's commands run as (its config's ``User``), inside the user namespace."""

    uid: int
    gid: int
    home: str


def _table(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [line.rstrip("\n").split(":") for line in fh if line.strip() and not line.startswith("#")]
    except OSError:
        return []


def image_user(root: str, user: str) -> ImageUser:
    """``user`` (``''``, ``name``, ``uid``, ``name:group``, ``uid:gid``) looked up in the image whose
    file system is at ``root`` on the host, as docker does (no entry: the numbers as given, home
    ``/``). Inside the sandbox's user namespace every file of the image belongs to this user."""
    name, _, group = (user or "root").partition(":")
    passwd = _table(os.path.join(root, "etc/passwd"))
    entry = next((e for e in passwd if len(e) >= 6 and (e[0] == name or e[2] == name)), None)
    if entry is not None:
        uid, gid, home = int(entry[2]), int(entry[3]), entry[5]
    elif name.isdigit():
        uid, gid, home = int(name), int(name), "/"
    else:
        raise SandboxError(f"the image's user {user!r} is not in its /etc/passwd")
    if group:
        groups = _table(os.path.join(root, "etc/group"))
        found = next((g for g in groups if len(g) >= 3 and (g[0] == group or g[2] == group)), None)
        gid = int(found[2]) if found is not None else int(group) if group.isdigit() else gid
    if not os.path.isdir(os.path.join(root, home.lstrip("/"))):
        home = ""
    return ImageUser(uid=uid, gid=gid, home=home)
