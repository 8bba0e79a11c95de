"""Unpacking one layer, unprivileged: OCI whiteouts and opaque directories become farm's
deleted paths, hard links, symlinks, modes and mtimes are kept, device nodes are skipped
with a note, and nothing is ever written outside the layer's directory."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from farm.errors import ImageMalformed
from farm.images.unpack import unpack_layer
from testkit.oci import Entry, tar_of_entries


def unpack(tmp_path: Path, entries: list[Entry], *, name: str = "tree", compress: bool = True, diff_id: str | None = None):
    tar = tar_of_entries(entries)
    dest = tmp_path / name
    dest.mkdir()
    data = gzip.compress(tar) if compress else tar
    report = unpack_layer(io.BytesIO(data), "gzip" if compress else "", dest, what="layer", diff_id=diff_id)
    return dest, report, tar


def test_files_links_modes_and_whiteouts(tmp_path: Path):
    entries = [
        Entry("usr", "dir", mode=0o755),
        Entry("usr/bin", "dir", mode=0o555, mtime=1_600_000_000),
        Entry("usr/bin/tool", data=b"#!/bin/sh\necho hi\n", mode=0o4755, mtime=1_650_000_000),
        Entry("usr/bin/alias", "hardlink", link="usr/bin/tool"),
        Entry("usr/bin/abs", "symlink", link="/usr/bin/tool"),
        Entry("etc/conf", data=b"x", mode=0o600),  # its parent comes without an entry of its own
        Entry("dev/null", "chardev"),
        Entry("run/pipe", "fifo", mode=0o600),
        Entry("var/lib/.wh.apt"),  # a whiteout: deletes var/lib/apt of the layers under
        Entry("opt/app/.wh..wh..opq"),  # an opaque directory
        Entry("opt/app/new.txt", data=b"new"),
        Entry("./tmp/", "dir", mode=0o1777),
    ]
    tree, report, tar = unpack(tmp_path, entries)
    tool = tree / "usr/bin/tool"
    assert tool.read_bytes() == b"#!/bin/sh\necho hi\n"
    assert stat.S_IMODE(tool.stat().st_mode) == 0o4755 and int(tool.stat().st_mtime) == 1_650_000_000
    assert os.path.samefile(tool, tree / "usr/bin/alias")
    assert os.readlink(tree / "usr/bin/abs") == "/usr/bin/tool"
    assert stat.S_IMODE((tree / "etc/conf").stat().st_mode) == 0o600
    # a directory keeps its mtime; the owner keeps rwx (the store reads and removes it), others as given
    assert stat.S_IMODE((tree / "usr/bin").stat().st_mode) == 0o755 and int((tree / "usr/bin").stat().st_mtime) == 1_600_000_000
    assert stat.S_IMODE((tree / "tmp").stat().st_mode) == 0o1777
    assert stat.S_ISFIFO((tree / "run/pipe").lstat().st_mode)
    assert not (tree / "dev/null").exists()
    assert report.skipped == ["/dev/null (character device 1:3: only root can make one; a sandbox has its own /dev)"]
    assert report.deleted == ["opt/app", "var/lib/apt"]
    assert (tree / "opt/app/new.txt").read_bytes() == b"new"  # the opaque directory is in the layer too
    assert not any(p.name.startswith(".wh.") for p in tree.rglob("*"))
    assert report.diff_id == "sha256:" + hashlib.sha256(tar).hexdigest() and report.tar_bytes == len(tar)


def test_a_later_entry_replaces_an_earlier_one(tmp_path: Path):
    tree, _, _ = unpack(tmp_path, [Entry("a", data=b"1"), Entry("a", "dir"), Entry("a/b", data=b"2"),
                                   Entry("a", "symlink", link="elsewhere")])  # fmt: skip
    assert os.readlink(tree / "a") == "elsewhere"


@pytest.mark.parametrize(
    "entries, says",
    [
        ([Entry("../escape", data=b"x")], "climbs out of the layer"),
        ([Entry("a/../../escape", data=b"x")], "climbs out of the layer"),
        ([Entry("link", "symlink", link="/etc"), Entry("link/passwd", data=b"x")], "which the layer made a symlink"),
        ([Entry("f", data=b"x"), Entry("f/g", data=b"x")], "which the layer made a file"),
        ([Entry("h", "hardlink", link="missing")], "no such file earlier in the layer"),
    ],
)
def test_entries_that_leave_the_layer_are_refused(tmp_path: Path, entries: list[Entry], says: str):
    with pytest.raises(ImageMalformed, match=says):
        unpack(tmp_path, entries)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]  # nothing written beside the layer


def test_the_uncompressed_digest_is_checked(tmp_path: Path):
    with pytest.raises(ImageMalformed, match="the image config says sha256:0000"):
        unpack(tmp_path, [Entry("a", data=b"1")], diff_id="sha256:" + "0" * 64)


def test_not_a_layer(tmp_path: Path):
    dest = tmp_path / "t"
    dest.mkdir()
    with pytest.raises(ImageMalformed, match="corrupt gzip data|not a valid tar"):
        unpack_layer(io.BytesIO(b"this is no gzip stream"), "gzip", dest, what="layer")
    good = gzip.compress(tar_of_entries([Entry("a", data=b"1" * 100_000)]))
    with pytest.raises(ImageMalformed, match="ends early|ends in the middle"):
        unpack_layer(io.BytesIO(good[: len(good) // 2]), "gzip", dest, what="layer")
    with pytest.raises(ImageMalformed, match="not a valid tar"):
        unpack_layer(io.BytesIO(gzip.compress(b"\x01" * 2000)), "gzip", dest, what="layer")


def test_unpack_runs_unprivileged(request: pytest.FixtureRequest):
    """As ``nobody`` (no capability, no root): the same tree, devices skipped, modes kept."""
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the other tests are the unprivileged path")
    work = Path(tempfile.mkdtemp(prefix="farm-unpack-nobody-"))  # pytest's tmp_path is root's alone (0700)
    request.addfinalizer(lambda: shutil.rmtree(work, ignore_errors=True))
    layer = work / "layer.tar.gz"
    layer.write_bytes(gzip.compress(tar_of_entries([
        Entry("bin", "dir", mode=0o555), Entry("bin/sh", data=b"x", mode=0o4755), Entry("bin/sh2", "hardlink", link="bin/sh"),
        Entry("dev/zero", "chardev"), Entry("etc/.wh.gone"), Entry("lib", "symlink", link="usr/lib"),
    ])))  # fmt: skip
    os.chown(work, 65534, 65534)
    os.chmod(work, 0o755)
    script = (
        "import io, json, os, sys; from pathlib import Path; from farm.images.unpack import unpack_layer\n"
        f"d = Path({str(work)!r}) / 'tree'; d.mkdir()\n"
        f"r = unpack_layer(open({str(layer)!r}, 'rb'), 'gzip', d, what='layer')\n"
        "print(json.dumps({'uid': os.geteuid(), 'deleted': r.deleted, 'skipped': len(r.skipped)}))"
    )
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable  # nobody cannot enter /root
    res = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=60,
                         user=65534, group=65534, extra_groups=[], env={"PYTHONPATH": str(Path(__file__).parents[2])})  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert '"uid": 65534' in res.stdout and '"deleted": ["etc/gone"]' in res.stdout and '"skipped": 1' in res.stdout
    tree = work / "tree"
    assert (tree / "bin/sh").stat().st_uid == 65534
    assert stat.S_IMODE((tree / "bin/sh").stat().st_mode) == 0o4755
    assert os.path.samefile(tree / "bin/sh", tree / "bin/sh2") and os.readlink(tree / "lib") == "usr/lib"


@pytest.fixture
def slow_first_write(monkeypatch: pytest.MonkeyPatch):
    """Files are written by threads while the tar is parsed: the first file's write held back
    (as a busy disk would), so what comes after it in the tar finds it still being written."""
    import threading
    import time

    from farm.images import unpack as unpack_mod

    real, first = unpack_mod._write_file, threading.Event()

    def write(path: str, *args):  # noqa: ANN002
        if not first.is_set():
            first.set()
            time.sleep(0.3)  # a slow first write: the others run meanwhile
        return real(path, *args)

    monkeypatch.setattr(unpack_mod, "_write_file", write)
    monkeypatch.setattr(unpack_mod, "SMALL", 0)  # every file through the writer threads


def test_entries_wait_for_the_file_they_depend_on(tmp_path: Path, slow_first_write: None):
    tree, _, _ = unpack(tmp_path, [Entry("bin/tool", data=b"old", mode=0o755), Entry("bin/other", data=b"o"),
                                   Entry("bin/alias", "hardlink", link="bin/tool"),  # fmt: skip
                                   Entry("etc/a", data=b"1"), Entry("etc/a", data=b"2", mode=0o600)], name="t1")
    assert os.path.samefile(tree / "bin/tool", tree / "bin/alias") and (tree / "bin/alias").read_bytes() == b"old"
    assert stat.S_IMODE((tree / "bin/alias").stat().st_mode) == 0o755
    tree, _, _ = unpack(tmp_path, [Entry("a", data=b"first"), Entry("a", data=b"second"), Entry("b", data=b"b")], name="t2")
    assert (tree / "a").read_bytes() == b"second"
    with pytest.raises(ImageMalformed, match="which the layer made a file"):
        unpack(tmp_path, [Entry("f", data=b"x"), Entry("f/g", data=b"x")], name="t3")


def test_a_writers_error_is_the_unpacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A file that cannot be written (a full disk) fails the layer; nothing is written after."""
    from farm.images import unpack as unpack_mod

    real = unpack_mod._write_file

    def write(path: str, *args):  # noqa: ANN002
        if path.endswith("/f3"):
            raise OSError(28, "No space left on device", path)
        if path.endswith(("/f4", "/f5")):
            time.sleep(0.3)  # still being written when f3 fails
        return real(path, *args)

    monkeypatch.setattr(unpack_mod, "_write_file", write)
    monkeypatch.setattr(unpack_mod, "SMALL", 0)  # every file through the writer threads
    with pytest.raises(OSError, match="No space left"):
        unpack(tmp_path, [Entry(f"d/f{i}", data=b"x" * 1000) for i in range(6)])
    before = sorted(p.name for p in (tmp_path / "tree/d").iterdir())
    assert "f3" not in before
    time.sleep(0.5)  # a window in which a writer left running would add a file
    assert sorted(p.name for p in (tmp_path / "tree/d").iterdir()) == before  # no writer left running


def test_a_large_file_is_written_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from farm.images import unpack as unpack_mod

    monkeypatch.setattr(unpack_mod, "_INLINE", 1000)
    monkeypatch.setattr(unpack_mod, "_CHUNK", 700)  # pieces of 2800 bytes
    big = bytes(range(256)) * 400
    tree, report, tar = unpack(tmp_path, [Entry("big", data=big, mode=0o640), Entry("small", data=b"s")])
    assert (tree / "big").read_bytes() == big and stat.S_IMODE((tree / "big").stat().st_mode) == 0o640
    assert report.diff_id == "sha256:" + hashlib.sha256(tar).hexdigest()
    cut = tar_of_entries([Entry("big", data=big)])[:60_000]  # the stream ends inside the large file
    dest = tmp_path / "cut"
    dest.mkdir()
    with pytest.raises(ImageMalformed, match="ends in the middle of an entry"):
        unpack_layer(io.BytesIO(cut), "", dest, what="layer")


def _inode_flags(path: Path) -> int | None:
    """``path``'s ext2/3/4 inode flags (``lsattr``), or None where the file system has none."""
    import fcntl
    import struct

    from farm.images import unpack as unpack_mod

    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, unpack_mod._FS_IOC_GETFLAGS, bytes(4)))[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def test_a_layers_tree_is_the_top_of_a_hierarchy(tmp_path: Path):
    """The layer's directory carries ext4's TOPDIR flag, so the inode allocator puts its
    directories in block groups of their own, away from trees the store just removed."""
    from farm.images import unpack as unpack_mod

    if _inode_flags(tmp_path) is None:
        pytest.skip("the test directory's file system has no inode flags (not ext2/3/4)")
    tree, report, _ = unpack(tmp_path, [Entry("usr/bin/tool", data=b"x", mode=0o755)])
    assert _inode_flags(tree) & unpack_mod._FS_TOPDIR_FL  # type: ignore[operator]
    # the layer's own directories keep their flags (only its root is a top)
    assert not _inode_flags(tree / "usr") & unpack_mod._FS_TOPDIR_FL  # type: ignore[operator]
    assert (tree / "usr/bin/tool").read_bytes() == b"x"


def test_a_file_system_without_the_flag_still_unpacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import errno

    from farm.images import unpack as unpack_mod

    def refused(fd: int, request: int, arg: bytes) -> bytes:
        raise OSError(errno.ENOTTY, "Inappropriate ioctl for device")  # tmpfs, xfs, overlayfs...

    monkeypatch.setattr(unpack_mod.fcntl, "ioctl", refused)
    assert unpack_mod.spread_inodes(tmp_path) is False
    tree, report, _ = unpack(tmp_path, [Entry("etc/conf", data=b"c", mode=0o644)])
    assert (tree / "etc/conf").read_bytes() == b"c" and report.files == 1
