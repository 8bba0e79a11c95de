"""Copy-on-write views of a frozen directory (an environment snapshot) for local sandboxes.

A sandbox started from a snapshot sees the snapshot's tree at a fixed path inside its
jail (``SnapshotView.mount``; the same path the snapshot was built at, since venvs and
editable installs hold absolute paths). Its writes land in the sandbox's own upper
directory; the frozen tree is never written and is never mounted anywhere else.

The merged view is mounted on the HOST, under the sandbox's 0700 directory, and bound
into every command's jail: all commands of a sandbox (and farm's own file calls) share
one mount, and the host sees what the sandbox sees. How (``sandbox.local.view``):

- ``overlay``: the kernel's overlayfs (``mount -t overlay``); needs CAP_SYS_ADMIN on the
  host (farm running as root). Mounting takes milliseconds; a rollout's disk use is the
  files it changed (copied up whole).
- ``fuse-overlayfs``: the same layering in user space (Debian ``fuse-overlayfs``), for
  farm running unprivileged; slower on metadata-heavy work.
- ``copy``: a full copy (``cp -a --reflink=auto``): reflinked on btrfs/xfs, a real copy on
  ext4 (seconds and the whole tree's size per sandbox). The fallback of last resort.
- ``auto``: ``overlay`` when farm runs as root, else ``fuse-overlayfs`` when installed,
  else ``copy`` (logged).

Mounts are recorded in the sandbox's labels file: ``farm reap`` unmounts what a crashed
actor left (``unmount_under``) before it removes anything.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import SandboxError

log = logging.getLogger(__name__)

ViewMode = Literal["auto", "overlay", "fuse-overlayfs", "copy"]


class SnapshotView(BaseModel):
    """What a sandbox starts from: ``lower`` (a host directory) shown at ``mount`` in its
    jail (local), or ``template`` holding the tree at ``mount`` (E2B).

    ``writable``: ``lower`` itself is bound read-write (building a snapshot); otherwise
    the sandbox gets a private copy-on-write view and ``lower`` is never written.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="the environment's key (for the record)")
    lower: str = Field(default="", description="local: the frozen tree's host directory (the build dir when writable)")
    mount: str = Field(description="absolute path where the tree appears inside the sandbox")
    writable: bool = False
    template: str | None = Field(default=None, description="E2B: the environment's template to create from")


def resolve_mode(mode: ViewMode) -> Literal["overlay", "fuse-overlayfs", "copy"]:
    if mode != "auto":
        return mode
    if os.geteuid() == 0:
        return "overlay"
    if shutil.which("fuse-overlayfs") and shutil.which("fusermount3"):
        return "fuse-overlayfs"
    log.warning("sandbox views: not root and no fuse-overlayfs: every sandbox copies its environment (slow)")
    return "copy"


def _run(argv: list[str], what: str, timeout: float = 600.0) -> None:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{what}: {exc}") from exc
    if res.returncode != 0:
        raise SandboxError(f"{what} failed (exit {res.returncode}): {(res.stderr or res.stdout).strip()[-500:]}")


def mount_view(lower: str, view_dir: Path, mode: Literal["overlay", "fuse-overlayfs", "copy"]) -> Path:
    """Make ``view_dir/merged``: a private writable view of ``lower``. Returns it."""
    if not os.path.isdir(lower):
        raise SandboxError(f"snapshot {lower} does not exist")
    upper, work, merged = view_dir / "upper", view_dir / "work", view_dir / "merged"
    for d in (upper, work):
        d.mkdir(parents=True, exist_ok=True)
    if mode == "copy":
        _run(["cp", "-a", "--reflink=auto", lower, str(merged)], f"copying snapshot {lower}")
        return merged
    merged.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    if mode == "overlay":
        _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], "mounting the overlay view")
    else:
        _run(["fuse-overlayfs", "-o", opts, str(merged)], "mounting the fuse-overlayfs view")
    return merged


def mounts_under(path: Path | str) -> list[str]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    prefix = os.path.realpath(path).rstrip("/")
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].encode().decode("unicode_escape")  # octal escapes (\040 = space)
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=len, reverse=True)


def unmount_under(path: Path | str) -> list[str]:
    """Unmount every view at or below ``path`` (lazily: a process still inside it cannot
    keep it from going). Returns what was unmounted; raises if a mount stays."""
    done = []
    for point in mounts_under(path):
        if shutil.which("fusermount3") and _is_fuse(point):
            argv = ["fusermount3", "-u", "-z", point]
        else:
            argv = ["umount", "-l", point]
        _run(argv, f"unmounting {point}", timeout=60)
        done.append(point)
    left = mounts_under(path)
    if left:
        raise SandboxError(f"still mounted under {path}: {left}")
    return done


def _is_fuse(point: str) -> bool:
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4] == point:
                return " - fuse" in line
    except OSError:
        pass
    return False
