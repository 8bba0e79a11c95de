"""tarfile's ``TarInfo``, its common headers read in one pass.

A layer's tar is parsed by ``tarfile`` (``farm.images.unpack``), and a tree of small files
(a Python install: one file per 22 KB) spends a fifth of its unpack there: ``TarInfo.frombuf``
takes ~24 µs a header, cutting and decoding its sixteen fields one call each. ``Header``
reads the header that describes itself (a regular file, link, directory, device or FIFO, octal
numbers, the unsigned checksum) with one ``struct`` unpack and gives
anything else to ``tarfile`` unchanged: pax and GNU long-name headers, sparse files, base-256
numbers, signed checksums, and every error (an end-of-archive block, a truncated or corrupt
header) are tarfile's own. What it builds is what ``TarInfo.frombuf`` builds
(``tests/images/test_images_tarheader.py`` compares the two field by field).
"""

from __future__ import annotations

import struct
import tarfile

# name mode uid gid size mtime chksum type linkname magic version uname gname devmajor devminor prefix
_FIELDS = struct.Struct("100s8s8s8s12s12s8s1s100s6s2s32s32s8s8s155s")
# the types a header describes alone: regular (and its old NUL and contiguous forms), hard and
# symbolic links, character and block devices, directories, FIFOs
_PLAIN = frozenset(b"\x0001234567")


def _text(field: bytes, encoding: str, errors: str) -> str:
    return field.split(b"\0", 1)[0].decode(encoding, errors)


class Header(tarfile.TarInfo):
    """A ``TarInfo`` whose ``frombuf`` reads the common header in one pass."""

    __slots__ = ()

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        if len(buf) != tarfile.BLOCKSIZE or buf[156] not in _PLAIN:
            return super().frombuf(buf, encoding, errors)
        name, mode, uid, gid, size, mtime, chksum, kind, linkname, _, _, uname, gname, major, minor, prefix = (
            _FIELDS.unpack_from(buf))  # fmt: skip
        try:  # octal, ended by a NUL or spaces (tarfile's nti)
            numbers = [int(f.split(b"\0", 1)[0].strip() or b"0", 8)
                       for f in (chksum, mode, uid, gid, size, mtime, major, minor)]  # fmt: skip
        except ValueError:  # base-256 (a first byte >= 0x80), or not a number: tarfile's to read or refuse
            return super().frombuf(buf, encoding, errors)
        if numbers[0] != 256 + sum(buf[:148]) + sum(buf[156:]):  # an all-zero block, a signed sum, a corrupt header
            return super().frombuf(buf, encoding, errors)
        obj = cls()
        obj.name = _text(name, encoding, errors)
        obj.chksum, obj.mode, obj.uid, obj.gid, obj.size, obj.mtime, obj.devmajor, obj.devminor = numbers
        obj.type = kind
        obj.linkname = _text(linkname, encoding, errors)
        obj.uname = _text(uname, encoding, errors)
        obj.gname = _text(gname, encoding, errors)
        if kind == tarfile.AREGTYPE and obj.name.endswith("/"):  # a V7 directory: a file with a trailing slash
            obj.type = tarfile.DIRTYPE
        if obj.type == tarfile.DIRTYPE:
            obj.name = obj.name.rstrip("/")
        if prefix[0]:  # ustar's long name: none of these types is a GNU one
            obj.name = _text(prefix, encoding, errors) + "/" + obj.name
        return obj
