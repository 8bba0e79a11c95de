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
import hashlib
import os
import queue
import shutil
import stat
import tarfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from farm.errors import ImageMalformed

_CHUNK = 1 << 20
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass
class LayerReport:
    """What one unpack produced."""

    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    files: int = 0
    tar_bytes: int = 0  # the uncompressed stream
    xattrs_dropped: int = 0
    diff_id: str = ""


class _Inflating:
    """A read() stream of ``raw`` decompressed, its uncompressed bytes hashed and counted.

    A thread of its own reads, decompresses and hashes (zlib and hashlib let go of the GIL):
    the caller's thread meanwhile parses the tar and writes files, so the two overlap on two
    cores. Decompressed chunks are kept whole and handed out by offset: a read copies only what
    it returns (tarfile asks 512 bytes for each header: shifting one buffer per read cost 5x
    the decompression itself)."""

    def __init__(self, raw: BinaryIO, compression: str, what: str) -> None:
        self.what = what
        self.hasher = hashlib.sha256()
        self.count = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._off = 0  # into the first chunk
        self._avail = 0
        self._eof = False
        if compression == "zstd":
            try:
                import zstandard
            except ImportError:
                raise ImageMalformed(f"{what}: a zstd layer needs the 'zstandard' package (pip install zstandard)") from None
            raw = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        elif compression not in ("gzip", ""):
            raise ImageMalformed(f"{what}: unknown compression {compression!r}")
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=16)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(raw, compression == "gzip"), daemon=True,
                                        name="farm-layer-inflate")  # fmt: skip
        self._thread.start()

    def _produce(self, raw: BinaryIO, gzip: bool) -> None:
        z = _gunzip() if gzip else None
        try:
            while not self._stop.is_set():
                chunk = raw.read(_CHUNK)
                if not chunk:
                    if z is not None and not z.eof:
                        raise ImageMalformed(f"{self.what}: the gzip stream ends early (truncated, or empty)")
                    break
                if z is None:
                    out = chunk
                else:
                    try:
                        out = z.decompress(chunk)
                        while z.eof and z.unused_data:  # a multi-member gzip stream
                            rest = z.unused_data
                            z = _gunzip()
                            out += z.decompress(rest)
                    except _GZIP_ERRORS as exc:
                        raise ImageMalformed(f"{self.what}: corrupt gzip data: {exc}") from None
                if out:
                    self.hasher.update(out)
                    self.count += len(out)
                    self._put(out)
            self._put(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread, raised there
            self._put(exc)

    def _put(self, item: bytes | BaseException | None) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _more(self) -> None:
        item = self._queue.get()
        if item is None:
            self._eof = True
        elif isinstance(item, BaseException):
            self._eof = True
            raise item
        else:
            self._chunks.append(item)
            self._avail += len(item)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
        while self._avail < n and not self._eof:
            self._more()
        pieces = []
        need = min(n, self._avail)
        self._avail -= need
        while need:
            first = self._chunks[0]
            left = len(first) - self._off
            if need < left:
                pieces.append(first[self._off : self._off + need])
                self._off += need
                break
            pieces.append(first[self._off :] if self._off else first)
            self._chunks.popleft()
            self._off = 0
            need -= left
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def drain(self) -> None:
        """Read to the end (the digest covers the whole stream)."""
        while not self._eof:
            self._more()
            self._chunks.clear()
            self._avail = self._off = 0
        self._thread.join()

    def close(self) -> None:
        """Stop the thread (also when the unpack failed midway)."""
        self._stop.set()
        self._thread.join()


try:  # ISA-L's inflate: the same gzip, ~2x zlib's speed (python-isal); zlib where it is missing
    from isal import isal_zlib as _inflate

    _GZIP_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate.error)
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
    _inflate = zlib  # type: ignore[assignment]
    _GZIP_ERRORS = (zlib.error,)


def _gunzip():  # noqa: ANN202 - a zlib-compatible decompress object
    return _inflate.decompressobj(wbits=31)


def _clean(name: str, what: str) -> str:
    """A member's path relative to the layer root ('' for the root itself)."""
    parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageMalformed(f"{what}: entry {name!r} climbs out of the layer ('..')")
    return "/".join(parts)


class _Tree:
    """The directory being written: parents checked once, modes of directories kept for last."""

    def __init__(self, root: Path, what: str) -> None:
        self.root = root
        self.what = what
        self._dirs: set[str] = {""}  # checked: real directories of this tree
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
        p = self.path(rel)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return
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


def unpack_layer(raw: BinaryIO, compression: str, dest: Path, *, what: str, diff_id: str | None = None) -> LayerReport:
    """Unpack the layer read from ``raw`` into ``dest`` (an empty directory)."""
    stream = _Inflating(raw, compression, what)
    try:
        return _unpack(stream, dest, what, diff_id)
    finally:
        stream.close()


def _unpack(stream: _Inflating, dest: Path, what: str, diff_id: str | None) -> LayerReport:
    tree = _Tree(dest, what)
    report = LayerReport()
    deleted: list[str] = []
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]
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
            _write_member(tar, m, rel, tree, report)
            report.files += 1
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


def _write_member(tar: tarfile.TarFile, m: tarfile.TarInfo, rel: str, tree: _Tree, report: LayerReport) -> None:
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
    if m.isreg():
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            src = tar.extractfile(m)
            if src is not None:
                while chunk := src.read(_CHUNK):
                    _write_all(fd, chunk)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.utime(p, (m.mtime, m.mtime), follow_symlinks=False)
    elif m.issym():
        os.symlink(m.linkname, p)
        os.utime(p, (m.mtime, m.mtime), follow_symlinks=False)
    elif m.islnk():
        target = _clean(m.linkname, tree.what)
        tp = tree.path(target)
        try:
            tree.parent_ready(target, create=False)
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _outermost(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in sorted(set(paths)):
        if not out or not p.startswith(out[-1] + "/"):
            out.append(p)
    return out
