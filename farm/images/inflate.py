"""A layer's blob as its uncompressed tar stream: decompressed in a thread of its own, hashed
and counted as it goes, read forward only (``farm.images.unpack`` parses and writes it).

The thread reads, decompresses (ISA-L's inflate when python-isal is there: ~2x zlib; zstd
through ``zstandard``) and hashes: those let go of the GIL, so they run on one core while the
unpacking thread parses headers on another. Decompressed chunks are kept whole and handed out
by offset: a header read copies its 512 bytes only, and a file's content comes out as views
of the chunks (``views``): no copy between the inflater and the ``write`` of the file.

The stream is seekable forward (``seek`` past what was read discards it), which is all
``tarfile``'s random-access mode asks of a file read in order: its headers are parsed without
its stream mode's buffer, and an entry's data is read here, not through ``tarfile``.
"""

from __future__ import annotations

import collections
import hashlib
import io
import queue
import threading
import zlib
from typing import BinaryIO

from farm.errors import ImageMalformed

_CHUNK = 1 << 20

try:  # ISA-L's inflate: the same gzip, ~2x zlib's speed (python-isal); zlib where it is missing
    from isal import isal_zlib as _inflate

    _GZIP_ERRORS: tuple[type[Exception], ...] = (zlib.error, _inflate.error)
except ImportError:  # pragma: no cover - isal is a dependency; a platform without its wheel
    _inflate = zlib  # type: ignore[assignment]
    _GZIP_ERRORS = (zlib.error,)


def _gunzip():  # noqa: ANN202 - a zlib-compatible decompress object
    return _inflate.decompressobj(wbits=31)


class Inflating:
    """``raw`` (``compression``: gzip, zstd or '' for a plain tar) decompressed; ``hasher``
    and ``count`` cover every uncompressed byte read from ``raw`` so far."""

    def __init__(self, raw: BinaryIO, compression: str, what: str) -> None:
        self.what = what
        self.hasher = hashlib.sha256()
        self.count = 0
        self._chunks: collections.deque[bytes] = collections.deque()
        self._off = 0  # into the first chunk
        self._avail = 0
        self._pos = 0  # uncompressed bytes handed out (or skipped)
        self._eof = False
        if compression == "zstd":
            try:
                # optional: zstandard
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

    # --- the inflating thread ---------------------------------------------------------------
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

    # --- the reading thread -----------------------------------------------------------------
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

    def _fill(self, n: int) -> int:
        while self._avail < n and not self._eof:
            self._more()
        return min(n, self._avail)

    def views(self, n: int) -> list[memoryview]:
        """The next ``n`` bytes as views of the decompressed chunks (fewer at the end of the stream)."""
        need = self._fill(n)
        self._avail -= need
        self._pos += need
        out = []
        while need:
            first = self._chunks[0]
            left = len(first) - self._off
            if need < left:
                out.append(memoryview(first)[self._off : self._off + need])
                self._off += need
                break
            out.append(memoryview(first)[self._off :])
            self._chunks.popleft()
            self._off = 0
            need -= left
        return out

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
        need = self._fill(n)
        first = self._chunks[0] if self._chunks else b""
        if need and need <= len(first) - self._off:  # a header: within one chunk, the usual case
            out = first[self._off : self._off + need]
            self._off += need
            self._avail -= need
            self._pos += need
            if self._off == len(first):
                self._chunks.popleft()
                self._off = 0
            return out
        return b"".join(self.views(need))

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        """Forward only: what lies between is read and dropped."""
        if whence == io.SEEK_CUR:
            pos += self._pos
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("an inflating stream seeks from its start or its position only")
        if pos < self._pos:
            raise io.UnsupportedOperation(f"an inflating stream cannot seek back (from {self._pos} to {pos})")
        while pos > self._pos:
            if not self.views(min(pos - self._pos, 1 << 24)):
                break  # the end of the stream: the next read says so
        return self._pos

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
