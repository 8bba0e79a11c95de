"""Copy-on-write views of frozen directories (environment snapshots) for local sandboxes.

A sandbox started from a snapshot sees the snapshot's tree at a fixed path inside its
jail (``SnapshotView.mount``; the same path the snapshot was built at, since venvs and
editable installs hold absolute paths). Its writes land in the sandbox's own upper
directory; the frozen tree is never written and is never mounted anywhere else.

A view may stack several frozen layers (``SnapshotView.layers``, top first: an
instance's checkout over its repository-version's base venv). A layer is plain files;
what it removes from the layers under it is a list of paths (``ViewLayer.deleted``),
turned into whiteouts at mount time (a small per-view mask layer under it: character
devices 0/0 for the kernel, ``.wh.<name>`` files for fuse-overlayfs without privileges)
or deleted from the copy. A directory both in a layer and in its ``deleted`` hides what
the layers under it hold there (an opaque directory).

The merged view is mounted on the HOST, under the sandbox's 0700 directory, and bound
into every command's jail: all commands of a sandbox (and farm's own file calls) share
one mount, and the host sees what the sandbox sees. How (``sandbox.local.view``):

- ``overlay``: the kernel's overlayfs (``mount -t overlay``); needs CAP_SYS_ADMIN on the
  host (farm running as root). Mounting takes milliseconds; a rollout's disk use is the
  files it changed (copied up whole).
- ``fuse-overlayfs``: the same layering in user space (Debian ``fuse-overlayfs``), for
  farm running unprivileged; slower on metadata-heavy work.
- ``copy``: a full copy (``cp -a --reflink=auto``) of every layer, bottom first: reflinked
  on btrfs/xfs, a real copy on ext4 (seconds and the whole tree's size per sandbox). The
  fallback of last resort.
- ``auto``: ``overlay`` when farm runs as root, else ``fuse-overlayfs`` when installed,
  else ``copy`` (logged).

Mounts are recorded in the sandbox's labels file: ``farm reap`` unmounts what a crashed
actor left (``unmount_under``) before it removes anything.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import SandboxError
from farm.sandboxes.config import ViewMode

log = logging.getLogger(__name__)


class ViewLayer(BaseModel):
    """One frozen tree of a view."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="the tree's host directory")
    deleted: tuple[str, ...] = Field(
        default=(), description="paths (relative to the tree) this layer removes from the layers under it"
    )


class SnapshotView(BaseModel):
    """What a sandbox starts from: ``layers`` (host directories, top first) shown merged at
    ``mount`` in its jail (local), or ``template`` holding the tree at ``mount`` (E2B).

    ``writable``: the one layer itself is bound read-write (building a snapshot);
    ``upper``: the writes land in this host directory (building a layer on top of
    ``layers``; overlay's work dir is ``<upper>.work``); otherwise the sandbox gets a
    private copy-on-write view and no layer is ever written.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(description="the environment's key (for the record)")
    layers: tuple[ViewLayer, ...] = Field(default=(), description="local: the frozen trees, top first")
    mount: str = Field(description="absolute path where the tree appears inside the sandbox")
    writable: bool = False
    upper: str = Field(default="", description="local: a build's upper directory (its writes: the new layer)")
    template: str | None = Field(default=None, description="E2B: the environment's template to create from")
    env: dict[str, str] = Field(
        default_factory=dict, description="a container image's (mount '/'): the environment every command starts with"
    )
    user: str = Field(default="", description="a container image's: the user its commands run as ('' = root)")

    @property
    def root(self) -> bool:
        """The view is the sandbox's whole file system (a container image), not one directory in it."""
        return self.mount == "/"

    @property
    def lower(self) -> str:
        """The top layer's host directory (the build dir when writable)."""
        return self.layers[0].path if self.layers else ""

    @property
    def building(self) -> bool:
        """A build's sandbox (its writes are the environment), not a rollout's."""
        return self.writable or bool(self.upper)


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


def mount_view(
    layers: Sequence[ViewLayer], view_dir: Path, mode: Literal["overlay", "fuse-overlayfs", "copy"],
    *, upper: Path | None = None,
) -> Path:
    """Make a writable view of ``layers`` (top first) under ``view_dir``; returns the
    directory to bind (``view_dir/merged``; with ``copy`` and an ``upper``: the upper itself,
    holding the copy). Writes land in ``upper`` (default ``view_dir/upper``)."""
    if not layers:
        raise SandboxError("a view needs at least one layer")
    for layer in layers:
        if not os.path.isdir(layer.path):
            raise SandboxError(f"snapshot {layer.path} does not exist")
        if ":" in layer.path or "," in layer.path:
            raise SandboxError(f"snapshot path {layer.path!r} holds ':' or ',' (overlay options cannot say it)")
    if mode == "copy":
        merged = upper if upper is not None else view_dir / "merged"
        merged.mkdir(parents=True, exist_ok=True)
        _copy_layers(layers, merged)
        return merged
    building = upper is not None
    work = Path(f"{upper}.work") if upper is not None else view_dir / "work"
    upper = upper if upper is not None else view_dir / "upper"
    for d in (upper, work):
        d.mkdir(parents=True, exist_ok=True)
    merged = view_dir / "merged"
    merged.mkdir(parents=True, exist_ok=True)
    lowers = []
    for i, layer in enumerate(layers):
        lowers.append(layer.path)
        if layer.deleted and i < len(layers) - 1:
            lowers.append(str(_mask(layer.deleted, view_dir / f"mask-{i}", kernel=mode == "overlay")))
    if sum(len(x) + 1 for x in lowers) > _MAX_LOWERDIR:
        lowers = _short_names(lowers, view_dir / "l")
    opts = f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}"
    if mode == "overlay":
        if building:  # a build's upper dir becomes a layer: self-contained (no redirects, no metadata-only copy-ups)
            opts += ",redirect_dir=off,metacopy=off"
        if not _syscall("mount", b"overlay", str(merged).encode(), b"overlay", 0, opts.encode()):
            _run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], "mounting the overlay view")
    else:
        _run(["fuse-overlayfs", "-o", opts, str(merged)], "mounting the fuse-overlayfs view")
    return merged


# mount(2) takes at most a page of options: an image of many layers names them by short links
_MAX_LOWERDIR = 3000


def _short_names(lowers: Sequence[str], links: Path) -> list[str]:
    """A symlink per lower directory, ``links/<i>`` (the kernel and fuse-overlayfs follow them)."""
    links.mkdir(parents=True, exist_ok=True)
    out = []
    for i, path in enumerate(lowers):
        link = links / str(i)
        if not link.is_symlink():
            os.symlink(path, link)
        out.append(str(link))
    return out


def _mask(deleted: Sequence[str], mask: Path, *, kernel: bool) -> Path:
    """A layer of whiteouts for ``deleted``: character devices 0/0 (what the kernel reads;
    fuse-overlayfs reads them too), or ``.wh.<name>`` files where mknod is not allowed
    (fuse-overlayfs without privileges)."""
    mask.mkdir(parents=True, exist_ok=True)
    for rel in deleted:
        parent, name = os.path.split(rel.strip("/"))
        if not name or name in (".", "..") or ".." in parent.split("/"):
            raise SandboxError(f"bad deleted path in a layer: {rel!r}")
        d = mask / parent
        d.mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(d / name, stat.S_IFCHR | 0o600, os.makedev(0, 0))
        except PermissionError:
            if kernel:
                raise SandboxError("overlay views need mknod (root) for a layer that deletes files") from None
            (d / f".wh.{name}").touch()
    return mask


def _copy_layers(layers: Sequence[ViewLayer], dest: Path) -> None:
    """``dest`` := the layers merged, bottom first: each copied over the ones under it,
    after what it deletes is removed from them."""
    for i, layer in enumerate(reversed(layers)):
        if i:
            for rel in layer.deleted:
                target = dest / rel.strip("/")
                if not os.path.realpath(target.parent).startswith(os.path.realpath(dest)):
                    raise SandboxError(f"a layer's deleted path {rel!r} leads out of the view")
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                elif target.exists() or target.is_symlink():
                    target.unlink()
        _run(["cp", "-a", "--reflink=auto", f"{layer.path}/.", f"{dest}/"],
             f"copying snapshot {layer.path}")  # fmt: skip


# mount(2) and umount2(2) called directly where this process may (root): a sandbox is made
# and removed per rollout, and forking the (large) farm process for mount(8) / umount(8)
# cost more CPU than the mount itself. The commands stay the fallback (and give the message).
_LIBC = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2


def _syscall(name: str, *args: object) -> bool:
    """``name`` (libc's mount / umount2) called directly; False where it failed or this
    process may not (not root): the caller then runs the command."""
    if os.geteuid() != 0:
        return False
    return getattr(_LIBC, name)(*args) == 0


def _mounts(path: Path | str) -> list[tuple[str, str]]:
    """(mount point, file system type) at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    prefix = os.path.realpath(path).rstrip("/")
    found = {}
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
            found[point] = fields[fields.index("-") + 1] if "-" in fields else ""
    return sorted(found.items(), key=lambda m: len(m[0]), reverse=True)


def mounts_under(path: Path | str) -> list[str]:
    """Mount points at or below ``path`` (deepest first), from /proc/self/mountinfo."""
    return [point for point, _ in _mounts(path)]


def unmount_under(path: Path | str) -> list[str]:
    """Unmount every view at or below ``path`` (lazily: a process still inside it cannot
    keep it from going). Returns what was unmounted; raises if a mount stays."""
    done, by_command = [], False
    for point, kind in _mounts(path):
        fuse = kind.startswith("fuse")
        if fuse and shutil.which("fusermount3"):
            _run(["fusermount3", "-u", "-z", point], f"unmounting {point}", timeout=60)
            by_command = True
        elif not _syscall("umount2", point.encode(), _MNT_DETACH):
            _run(["umount", "-l", point], f"unmounting {point}", timeout=60)
            by_command = True
        done.append(point)
    # umount2 returning 0 has detached the mount; a command's exit status is checked in the table
    left = mounts_under(path) if by_command else []
    if left:
        raise SandboxError(f"still mounted under {path}: {left}")
    return done
