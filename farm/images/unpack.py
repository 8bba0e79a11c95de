"""One image layer (a tar, plain, gzip or zstd) unpacked into a plain directory, unprivileged.

The result is farm's layer format (``farm.envs.layers``): the files the layer adds or
changes, and the paths it removes from the layers under it (``LayerReport.deleted``).
OCI whiteouts become that list: ``.wh.<name>`` deletes ``name``; ``.wh..wh..opq`` makes its
directory opaque (the directory is kept in the layer AND listed as deleted: a view shows
only this layer's content there).

What is kept: regular files with their modes (setuid/setgid/sticky included) and mtimes,
directories (their modes and mtimes set last, so a read-only directory still takes its
children), symlinks as they are (absolute targets mean the sandbox's root), hard links
(within the layer, as the spec has them), FIFOs. What is not: ownership (the files belong
to the user farm runs as; inside a sandbox's user namespace they belong to the sandbox's
user), device nodes (only root can make them; skipped and listed in ``skipped``), extended
attributes (``security.capability`` and the like need privileges; counted).

An entry that climbs out of the layer (``..``), or passes through a symlink or a file the
layer made, is refused (``ImageMalformed``): an unpacked tree is never written outside its
directory. The uncompressed stream's sha256 is checked against the config's ``diff_id``.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import shutil
import stat
import struct
import tarfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from farm.errors import ImageMalformed
from farm.images.inflate import Inflating
from farm.images.tarheader import Header

_CHUNK = 1 << 20
# Files larger than SMALL are written by a few threads while the tar is parsed: filling a large
# file is kernel time with the GIL let go (os.write), and the parser runs ahead of them by at
# most this many bytes (or files). A small file is written by the parsing thread itself: its
# hand-off (a future, a queue, the GIL taken back after each of its syscalls, up to a switch
# interval each while another thread runs Python) cost more than its syscalls, and a tree of
# small files (a Python install: one file per 22 KB) unpacked slower than GNU tar with them.
SMALL = 64 << 10
WRITERS = 3
_AHEAD_BYTES = 32 << 20
_AHEAD_FILES = 1024
_INLINE = 8 << 20  # a file this large is written by the parsing thread, piece by piece
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
# ext2/3/4's "top of a directory hierarchy" inode flag (chattr +T; linux/fs.h), read and set
# with the FS_IOC_GETFLAGS / FS_IOC_SETFLAGS ioctls (an int each way)
_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_TOPDIR_FL = 0x00020000


@dataclass
class LayerReport:
    """What one unpack produced."""

    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    files: int = 0
    tar_bytes: int = 0  # the uncompressed stream
    xattrs_dropped: int = 0
    diff_id: str = ""


def _clean(name: str, what: str) -> str:
    """A member's path relative to the layer root ('' for the root itself)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageMalformed(f"{what}: entry {name!r} climbs out of the layer ('..')")
    return "/".join(parts)


class _Writers:
    """Regular files larger than ``SMALL`` written by ``WRITERS`` threads, in any order, while
    the tar is parsed (smaller ones written at once, by the caller).

    An entry that depends on a file still being written waits for that file alone: one that
    replaces it (``wait``), a hard link to it (``wait``); removing a directory waits for all.
    A writer's error (a full disk) is raised in the parsing thread at the next wait or hand-off."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WRITERS, thread_name_prefix="farm-layer-write")
        self._order: collections.deque[tuple[str, Future, int]] = collections.deque()
        self.pending: dict[str, Future] = {}  # rel -> its write, until collected
        self._bytes = 0

    def submit(self, rel: str, path: str, data: list[memoryview], size: int, mode: int, mtime: float) -> None:
        if size <= SMALL:
            _write_file(path, data, mode, mtime)
            return
        fut = self._pool.submit(_write_file, path, data, mode, mtime)
        self.pending[rel] = fut
        self._order.append((rel, fut, size))
        self._bytes += size
        while self._order and (self._order[0][1].done() or self._bytes > _AHEAD_BYTES or len(self._order) > _AHEAD_FILES):
            self._collect()

    def _collect(self) -> None:
        rel, fut, size = self._order.popleft()
        self._bytes -= size
        if self.pending.get(rel) is fut:
            del self.pending[rel]
        fut.result()

    def wait(self, rel: str) -> None:
        fut = self.pending.get(rel)
        if fut is not None:
            fut.result()

    def wait_all(self) -> None:
        while self._order:
            self._collect()

    def close(self) -> None:
        """Every write finished or cancelled (also after a failure: the caller removes the tree)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _write_file(path: str, data: list[memoryview], mode: int, mtime: float) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        for piece in data:
            _write_all(fd, piece)
        os.fchmod(fd, mode)
        os.utime(fd, (mtime, mtime))
    finally:
        os.close(fd)


class _Tree:
    """The directory being written: parents checked once, modes of directories kept for last."""

    def __init__(self, root: Path, what: str, writers: _Writers) -> None:
        self.root = root
        self.what = what
        self.writers = writers
        self._dirs: set[str] = {""}  # checked: real directories of this tree
        self._made: set[str] = set()  # the entries written so far (the tree starts empty)
        self.dir_meta: dict[str, tuple[int, float]] = {}

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else str(self.root)

    def parent_ready(self, rel: str, *, create: bool = True) -> None:
        """Every directory above ``rel`` exists as a real directory (made when missing,
        ``create``; else FileNotFoundError)."""
        parent = os.path.dirname(rel)
        if parent in self._dirs:
            return
        self.parent_ready(parent, create=create)
        if parent in self.writers.pending:
            raise ImageMalformed(f"{self.what}: an entry lies under {parent!r}, which the layer made a file")
        p = self.path(parent)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(p, 0o755)
        else:
            if not stat.S_ISDIR(st.st_mode):
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a file"
                raise ImageMalformed(f"{self.what}: an entry lies under {parent!r}, which the layer made {kind}")
        self._dirs.add(parent)

    def clear(self, rel: str, keep_dir: bool) -> None:
        """Make room for ``rel`` (a later entry of a tar replaces an earlier one)."""
        if rel not in self._made and rel not in self._dirs:
            self._made.add(rel)
            return  # nothing there: only this layer's entries and the parents made for them are
        self.writers.wait(rel)
        p = self.path(rel)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
            self.writers.wait_all()  # files under it may still be being written
            _make_writable(p)
            shutil.rmtree(p)
            self._dirs = {d for d in self._dirs if d != rel and not d.startswith(rel + "/")}
            self.dir_meta = {d: m for d, m in self.dir_meta.items() if d != rel and not d.startswith(rel + "/")}
        else:
            os.unlink(p)

    def mark_dir(self, rel: str) -> None:
        self._dirs.add(rel)


def _make_writable(path: str) -> None:
    for dirpath, dirnames, _ in os.walk(path):
        os.chmod(dirpath, 0o700)


@contextlib.contextmanager
def _tar_errors(what: str) -> Iterator[None]:
    """tarfile's errors (from reading a header or an entry's data) as the layer's."""
    try:
        yield
    except tarfile.TarError as exc:
        raise ImageMalformed(f"{what}: not a valid tar stream: {exc}") from None
    except EOFError:
        raise ImageMalformed(f"{what}: the tar stream ends in the middle of an entry") from None


def spread_inodes(path: Path) -> bool:
    """Mark ``path`` the top of a hierarchy for ext4's inode allocator (``chattr +T``), so the
    directories made in it go to block groups of their own, chosen by how free they are
    (Orlov), instead of the group of ``path``'s parent. Whether it took (only ext2/3/4 have it).

    Why: on ext4 without a journal (``nojournal``, as on this kind of VM disk), allocating an
    inode skips every free inode of the group that was deleted in the last minute (up to six
    while its inode table block is dirty), one buffer-cache lookup each (``recently_deleted``
    in fs/ext4/ialloc.c). A layer unpacked next to trees the store has just removed (an
    evicted layer, a failed build) then pays 0.5-0.8 ms of kernel CPU per file instead of
    ~25 µs (measured on this machine: 2,000 empty files made in a fresh group, then in the same
    directory after ``rm -rf`` of 4,000). A journalled ext4 does not skip, and loses nothing
    by the flag: it only places directories."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(4)))[0]
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags | _FS_TOPDIR_FL))
    except OSError:  # not ext2/3/4 (ENOTTY, EOPNOTSUPP), or a flag the fs refuses: placement only
        return False
    finally:
        os.close(fd)
    return True


def unpack_layer(raw: BinaryIO, compression: str, dest: Path, *, what: str, diff_id: str | None = None) -> LayerReport:
    """Unpack the layer read from ``raw`` into ``dest`` (an empty directory)."""
    spread_inodes(dest)
    stream = Inflating(raw, compression, what)
    writers = _Writers()
    try:
        return _unpack(stream, _Tree(dest, what, writers), diff_id)
    finally:
        writers.close()
        stream.close()


def _unpack(stream: Inflating, tree: _Tree, diff_id: str | None) -> LayerReport:
    what = tree.what
    report = LayerReport()
    deleted: list[str] = []
    try:
        # random-access mode over a stream read in order (it seeks forward only): headers parsed
        # without the stream mode's buffer; an entry's data is read by _write_member, not tarfile
        tar = tarfile.open(fileobj=stream, mode="r:", tarinfo=Header)  # type: ignore[call-overload]
    except tarfile.TarError as exc:
        raise ImageMalformed(f"{what}: not a valid tar stream: {exc}") from None
    with tar, _tar_errors(what):
        for m in tar:
            rel = _clean(m.name, what)
            if not rel:
                if m.isdir():
                    tree.dir_meta[""] = (m.mode & 0o7777, m.mtime)
                continue
            parent, base = os.path.split(rel)
            if base.startswith(WHITEOUT):
                if base == OPAQUE:
                    tree.parent_ready(rel)
                    deleted.append(parent)
                else:
                    deleted.append(os.path.join(parent, base[len(WHITEOUT):]))
                continue
            tree.parent_ready(rel)
            if m.pax_headers and any(k.startswith("SCHILY.xattr.") for k in m.pax_headers):
                report.xattrs_dropped += 1
            _write_member(tar, stream, m, rel, tree, report)
            report.files += 1
    tree.writers.wait_all()
    stream.drain()  # the end-of-archive blocks and padding: part of the stream the diff_id covers
    for rel in sorted(tree.dir_meta, key=lambda r: r.count("/"), reverse=True):  # children before parents
        mode, mtime = tree.dir_meta[rel]
        p = tree.path(rel)
        if os.path.isdir(p) and not os.path.islink(p):
            os.utime(p, (mtime, mtime), follow_symlinks=False)
            os.chmod(p, mode | 0o700)  # the owner keeps rwx: the store must read, stat and remove it
    report.tar_bytes = stream.count
    report.diff_id = "sha256:" + stream.hasher.hexdigest()
    if diff_id and report.diff_id != diff_id:
        raise ImageMalformed(f"{what}: its uncompressed content has digest {report.diff_id}, the image config says "
                             f"{diff_id}")  # fmt: skip
    report.deleted = _outermost([d for d in deleted if d])
    return report


def _data(stream: Inflating, m: tarfile.TarInfo, n: int) -> list[memoryview]:
    views = stream.views(n)
    if sum(len(v) for v in views) < n:
        raise EOFError(f"{m.name}: the stream ends in its data")
    return views


def _write_member(tar: tarfile.TarFile, stream: Inflating, m: tarfile.TarInfo, rel: str, tree: _Tree,
                  report: LayerReport) -> None:  # fmt: skip
    p = tree.path(rel)
    mode = m.mode & 0o7777
    if m.isdir():
        tree.clear(rel, keep_dir=True)
        if not os.path.isdir(p):
            os.mkdir(p, 0o700)
        tree.mark_dir(rel)
        tree.dir_meta[rel] = (mode, m.mtime)
        return
    tree.clear(rel, keep_dir=False)
    if m.isreg() and not m.issparse() and m.size <= _INLINE:
        if stream.tell() != m.offset_data:
            stream.seek(m.offset_data)
        tree.writers.submit(rel, p, _data(stream, m, m.size), m.size, mode, m.mtime)
    elif m.isreg():  # large (or sparse, which tarfile maps): written here, a piece at a time
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if m.issparse():
                src = tar.extractfile(m)
                while chunk := src.read(_CHUNK):  # type: ignore[union-attr]
                    _write_all(fd, chunk)
            else:
                stream.seek(m.offset_data)
                left = m.size
                while left:
                    for piece in _data(stream, m, min(left, 4 * _CHUNK)):
                        _write_all(fd, piece)
                        left -= len(piece)
            os.fchmod(fd, mode)
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)
    elif m.issym():
        os.symlink(m.linkname, p)
        os.utime(p, (m.mtime, m.mtime), follow_symlinks=False)
    elif m.islnk():
        target = _clean(m.linkname, tree.what)
        tp = tree.path(target)
        try:
            tree.parent_ready(target, create=False)
            tree.writers.wait(target)  # its content and mode are the link's
            st = os.lstat(tp)
        except (FileNotFoundError, ImageMalformed):
            raise ImageMalformed(f"{tree.what}: hard link {rel!r} -> {m.linkname!r}: no such file earlier in the "
                                 "layer") from None  # fmt: skip
        if stat.S_ISDIR(st.st_mode):
            raise ImageMalformed(f"{tree.what}: hard link {rel!r} -> {m.linkname!r} is a directory")
        os.link(tp, p, follow_symlinks=False)
    elif m.isfifo():
        os.mkfifo(p, mode)
    elif m.ischr() or m.isblk():
        kind = "character" if m.ischr() else "block"
        report.skipped.append(f"/{rel} ({kind} device {m.devmajor}:{m.devminor}: only root can make one; a "
                              "sandbox has its own /dev)")  # fmt: skip
    else:
        report.skipped.append(f"/{rel} (tar entry type {m.type!r})")


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _outermost(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in sorted(set(paths)):
        if not out or not p.startswith(out[-1] + "/"):
            out.append(p)
    return out
