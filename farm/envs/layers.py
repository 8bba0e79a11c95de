"""Layers of a layered environment, as farm stores them: plain trees, never overlay's own format.

A base layer holds what a repository-version's heavy setup created that git does not
track (the venv), at the paths it had in the checkout; nothing tracked and no ``.git``
of that checkout (``keep_untracked``). An instance layer is what an instance's build
wrote on top of a view of its base: the checkout, the pre-patch, the editable install.

A build's writes come back in the shape of the view that took them: an overlay upper
directory (kernel overlayfs or fuse-overlayfs: whiteouts, opaque-directory markers,
overlay's own xattrs) or, in ``copy`` mode, a whole copy of the base written over.
``seal_layer`` turns either into farm's layer: the files the build added or changed,
plus the list of paths it removed from the base (``ViewLayer.deleted``; a directory in
both the layer and that list replaces the base's directory whole). The same layer then
mounts in any view mode (``farm.sandboxes.views``), whichever mode built it.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from farm.errors import TaskError

_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque", "user.fuseoverlayfs.opaque")
_OVERLAY_XATTR_PREFIXES = ("trusted.overlay.", "user.overlay.", "user.fuseoverlayfs.")
_OPAQUE_FILES = (".wh..wh..opq", ".wh..opq")


def seal_layer(tree: Path, mode: Literal["overlay", "fuse-overlayfs", "copy"], base: Path | Sequence[Path]) -> list[str]:
    """Make ``tree`` (a build's upper directory, or its copy of ``base`` in copy mode) a
    plain layer; returns the paths it deletes from ``base`` (outermost only). ``base`` may be
    several layers (a container image's): copy mode cannot tell what changed over those."""
    bases = [base] if isinstance(base, Path) else list(base)
    if mode == "copy":
        if len(bases) != 1:
            raise TaskError("an environment over a container image needs an overlay view to build (sandbox.local.view "
                            "overlay or fuse-overlayfs; copy cannot tell its changes from the image's layers)")
        deleted = _diff_copy(tree, bases[0])
    else:
        deleted = _strip_overlay(tree)
    # (fuse-overlayfs marks the directories it creates opaque: nothing under them to hide)
    return _outermost([d for d in deleted if any(os.path.lexists(b / d) for b in bases)])


def _outermost(paths: list[str]) -> list[str]:
    """Drop paths under another one: the outer deletion (or opaque directory) covers them."""
    out: list[str] = []
    for p in sorted(set(paths)):
        if not out or not p.startswith(out[-1] + "/"):
            out.append(p)
    return out


def _xattrs(path: str) -> dict[str, bytes]:
    try:
        return {a: os.getxattr(path, a, follow_symlinks=False) for a in os.listxattr(path, follow_symlinks=False)}
    except OSError:  # a file system or an entry (symlink) without xattrs
        return {}


def _strip_overlay(tree: Path) -> list[str]:
    """Whiteouts and opaque markers out of an overlay upper dir (both kernel and
    fuse-overlayfs forms), returned as deletions; overlay's xattrs removed."""
    deleted: list[str] = []
    for dirpath, dirnames, filenames in os.walk(tree):
        rel_dir = os.path.relpath(dirpath, tree)
        rel = (lambda name: name) if rel_dir == "." else (lambda name, d=rel_dir: f"{d}/{name}")
        attrs = _xattrs(dirpath)
        if rel_dir != "." and any(attrs.get(a, b"").startswith(b"y") for a in _OPAQUE_XATTRS):
            deleted.append(rel_dir)
        _drop_overlay_xattrs(dirpath, attrs)
        for name in list(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            whiteout = stat.S_ISCHR(st.st_mode) and st.st_rdev == 0
            if name in _OPAQUE_FILES and (whiteout or stat.S_ISREG(st.st_mode)):
                if rel_dir != ".":
                    deleted.append(rel_dir)
                os.unlink(path)
            elif whiteout:
                deleted.append(rel(name))
                os.unlink(path)
            elif name.startswith(".wh.") and stat.S_ISREG(st.st_mode):  # fuse-overlayfs without mknod
                deleted.append(rel(name[len(".wh."):]))
                os.unlink(path)
            else:
                attrs = _xattrs(path)
                if "trusted.overlay.whiteout" in attrs or "user.overlay.whiteout" in attrs:  # an xwhiteout
                    deleted.append(rel(name))
                    os.unlink(path)
                else:
                    _drop_overlay_xattrs(path, attrs)
    return deleted


def _drop_overlay_xattrs(path: str, attrs: dict[str, bytes]) -> None:
    for a in attrs:
        if a.startswith(_OVERLAY_XATTR_PREFIXES):
            os.removexattr(path, a, follow_symlinks=False)


def _same(a: os.stat_result, b: os.stat_result, pa: str, pb: str) -> bool:
    if stat.S_IFMT(a.st_mode) != stat.S_IFMT(b.st_mode) or a.st_mode != b.st_mode:
        return False
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(pa) == os.readlink(pb)
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns  # cp -a kept both; a write changes them


def _diff_copy(tree: Path, base: Path) -> list[str]:
    """``tree`` began as ``cp -a`` of ``base``: remove what is unchanged, return what is gone."""
    deleted: list[str] = []

    def walk(rel: str) -> bool:
        """Prune ``tree/rel``; True when nothing of it is left to keep."""
        t_dir, b_dir = os.path.join(tree, rel), os.path.join(base, rel)
        t_names = set(os.listdir(t_dir))
        b_names = set(os.listdir(b_dir))
        deleted.extend(os.path.join(rel, n) if rel else n for n in sorted(b_names - t_names))
        empty = True
        for name in sorted(t_names):
            r = os.path.join(rel, name) if rel else name
            tp, bp = os.path.join(tree, r), os.path.join(base, r)
            ts = os.lstat(tp)
            if name not in b_names:
                empty = False
                continue
            bs = os.lstat(bp)
            if stat.S_IFMT(ts.st_mode) != stat.S_IFMT(bs.st_mode):
                deleted.append(r)  # replaced by another kind: the base's goes, the layer's stays
                empty = False
            elif stat.S_ISDIR(ts.st_mode):
                if walk(r) and ts.st_mode == bs.st_mode:
                    os.rmdir(tp)
                else:
                    empty = False
            elif _same(ts, bs, tp, bp):
                os.unlink(tp)
            else:
                empty = False
        return empty

    walk("")
    return deleted


def keep_untracked(checkout: Path, paths: list[str], dest: Path) -> None:
    """Move each of ``paths`` (as ``git ls-files --others --directory`` names them) from
    ``checkout`` to the same place under ``dest``, then remove the checkout: a base layer
    holds what its setup created, never a tracked file or the ``.git`` of the commit it
    was built at. A path through a symlink (setup may create any) is refused."""
    for raw in paths:
        rel = raw.rstrip("/")
        parts = rel.split("/")
        if not rel or any(p in ("", ".", "..") for p in parts) or parts[0] == ".git":
            raise TaskError(f"base environment: refusing the untracked path {raw!r}")
        src = checkout
        for part in parts[:-1]:
            src = src / part
            st = os.lstat(src)
            if not stat.S_ISDIR(st.st_mode):
                raise TaskError(f"base environment: {raw!r} lies under {src.relative_to(checkout)}, not a directory")
            (dest / src.relative_to(checkout)).mkdir(exist_ok=True)
            shutil.copystat(src, dest / src.relative_to(checkout), follow_symlinks=False)
        os.rename(checkout / rel, dest / rel)
    shutil.rmtree(checkout)
