"""``farm.images.tarheader.Header`` builds what tarfile's own ``TarInfo`` builds, header by
header and archive by archive, and leaves every other header and every error to tarfile."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from farm.images.tarheader import Header

FIELDS = ("name", "mode", "uid", "gid", "size", "mtime", "chksum", "type", "linkname", "uname", "gname", "devmajor",
          "devminor")  # fmt: skip
ROOT = Path(__file__).resolve().parents[2]


def info(name: str, kind: bytes = tarfile.REGTYPE, **kw) -> tarfile.TarInfo:  # noqa: ANN003
    t = tarfile.TarInfo(name)
    t.type = kind
    t.mode, t.uid, t.gid, t.mtime, t.uname, t.gname = 0o644, 1000, 1000, 1_700_000_000, "dev", "staff"
    for k, v in kw.items():
        setattr(t, k, v)
    return t


def with_checksum(buf: bytearray, *, signed: bool = False) -> bytes:
    buf[148:156] = b" " * 8
    total = sum((b - 256 if b > 127 else b) for b in buf) if signed else sum(buf)
    buf[148:156] = b"%06o\0 " % total
    return bytes(buf)


def outcome(cls: type[tarfile.TarInfo], buf: bytes) -> object:
    try:
        t = cls.frombuf(buf, "utf-8", "surrogateescape")
    except Exception as exc:  # noqa: BLE001 - the type of error is what is compared
        return type(exc)
    return {f: getattr(t, f) for f in FIELDS}


HEADERS = {
    "file": info("usr/lib/python3/site.py", size=12345),
    "empty file": info("etc/empty", size=0),
    "directory": info("usr/lib/", tarfile.DIRTYPE, mode=0o755),
    "symlink": info("usr/bin/python", tarfile.SYMTYPE, linkname="python3.10"),
    "hard link": info("usr/bin/python3", tarfile.LNKTYPE, linkname="usr/bin/python3.10"),
    "character device": info("dev/null", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666),
    "block device": info("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0),
    "fifo": info("run/pipe", tarfile.FIFOTYPE),
    "setuid": info("usr/bin/su", mode=0o4755, size=1),
    "ustar long name (prefix)": info("a" * 90 + "/" + "b" * 60 + "/file.txt", size=3),
    "utf-8 name": info("srv/données/ünïcode.txt", size=4),
    "not utf-8 name": info("srv/\udcff\udcfe.bin", size=4),
}


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ustar", "gnu", "pax"])
@pytest.mark.parametrize("case", list(HEADERS))
def test_each_header_is_read_as_tarfile_reads_it(case: str, fmt: int, monkeypatch: pytest.MonkeyPatch):
    buf = HEADERS[case].tobuf(fmt, "utf-8", "surrogateescape")[-tarfile.BLOCKSIZE :]  # the member's own header
    theirs = outcome(tarfile.TarInfo, buf)
    assert isinstance(theirs, dict)

    def not_tarfiles(cls, *args):  # noqa: ANN001, ANN002, ANN202
        raise AssertionError("a common header went to tarfile's own frombuf")

    monkeypatch.setattr(tarfile.TarInfo, "frombuf", classmethod(not_tarfiles))  # read in the one pass, or fail
    assert outcome(Header, buf) == theirs


def raw(t: tarfile.TarInfo) -> bytearray:
    return bytearray(t.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")[-tarfile.BLOCKSIZE :])


def spaced(buf: bytearray) -> bytearray:
    buf[100:108] = b"   644 \0"  # old tars: numbers padded with spaces
    buf[124:136] = b"        12 \0"
    return buf


def v7_dir(buf: bytearray) -> bytearray:
    buf[156:157] = tarfile.AREGTYPE  # a V7 directory: a file whose name ends in a slash
    return buf


def not_octal(buf: bytearray) -> bytearray:
    buf[124:136] = b"00000000009\0"
    return buf


ODD = {
    "numbers padded with spaces": lambda: with_checksum(spaced(raw(info("f", size=12)))),
    "V7 directory": lambda: with_checksum(v7_dir(raw(info("old/dir/", tarfile.AREGTYPE)))),
    "signed checksum": lambda: with_checksum(raw(info("é" * 20, size=1)), signed=True),
    "base-256 size": lambda: bytes(raw(info("huge", size=1 << 40))),
    "base-256 uid": lambda: bytes(raw(info("f", uid=1 << 30))),
    "base-256 mtime (before 1970)": lambda: bytes(raw(info("f", mtime=-86400))),
    "GNU sparse": lambda: with_checksum(bytearray(raw(info("sparse", size=0)))[:156] + bytearray(b"S")
                                        + raw(info("sparse"))[157:]),  # fmt: skip
    "pax header": lambda: bytes(raw(info("x", tarfile.XHDTYPE, size=30))),
    "bad checksum": lambda: bytes(raw(info("f", size=1))[:148] + b"0000001\0" + raw(info("f", size=1))[156:]),
    "not octal": lambda: with_checksum(not_octal(raw(info("f", size=1)))),
    "end-of-archive block": lambda: bytes(tarfile.BLOCKSIZE),
    "truncated": lambda: bytes(raw(info("f", size=1)))[:300],
    "empty": lambda: b"",
}


@pytest.mark.parametrize("case", list(ODD))
def test_odd_headers_and_errors_are_tarfiles(case: str):
    buf = ODD[case]()
    assert outcome(Header, buf) == outcome(tarfile.TarInfo, buf)


def members(data: bytes, cls: type[tarfile.TarInfo]) -> list[tuple]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:", tarinfo=cls) as tar:
        return [(m.offset, m.offset_data, m.pax_headers, m.sparse, *(getattr(m, f) for f in FIELDS)) for m in tar]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_a_whole_archive_is_read_as_tarfile_reads_it(fmt: int):
    """farm's own sources packed by tarfile (its long paths in pax or GNU long-name headers)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        tar.add(ROOT / "farm", arcname="x" * 80 + "/" + "y" * 40 + "/farm")  # names over 100 bytes: long-name headers
    ours, theirs = members(buf.getvalue(), Header), members(buf.getvalue(), tarfile.TarInfo)
    assert ours == theirs and len(ours) > 50


def test_gnu_tar_s_own_archive(tmp_path: Path):
    """What GNU tar writes (its default format), read alike."""
    out = subprocess.run(["tar", "-cf", "-", "-C", str(ROOT), "farm", "docs"], check=True, capture_output=True).stdout
    assert members(out, Header) == members(out, tarfile.TarInfo)
