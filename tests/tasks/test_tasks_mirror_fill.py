"""``farm fill-mirror``: a mirror's missing blobs written from a release's files, and only those."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from farm.cli import main
from farm.errors import TaskError
from farm.tasks.model import GitSource
from farm.tasks.repos import RepoCache

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, capture_output=True, text=True, check=True).stdout.strip()


def has(mirror: Path, oid: str) -> bool:
    return subprocess.run(["git", "--git-dir", str(mirror), "cat-file", "-e", oid], capture_output=True).returncode == 0


def snapshot(tmp: Path, data: bytes) -> tuple[Path, str, str]:
    """A bare mirror (loose objects) of a repo whose commit holds pkg/data.bin, with that blob
    deleted, as a snapshot without its large files is; returns (mirror, commit, blob id)."""
    work = tmp / "work"
    (work / "pkg").mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    (work / "pkg" / "__init__.py").write_text("x = 1\n")
    (work / "pkg" / "data.bin").write_bytes(data)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "data")
    commit, blob = git(work, "rev-parse", "HEAD"), git(work, "rev-parse", "HEAD:pkg/data.bin")
    mirror = tmp / "mirrors" / "o__r.git"
    git(tmp, "init", "-q", "--bare", str(mirror))
    git(work, "push", "-q", str(mirror), "main")
    (mirror / "objects" / blob[:2] / blob[2:]).unlink()
    return mirror, commit, blob


def sdist(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


async def test_a_release_file_fills_the_blob_the_row_failed_on(tmp_path, capsys):
    data = os.urandom(8192)
    mirror, commit, blob = snapshot(tmp_path, data)
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=[tmp_path / "mirrors"], fetch=False)
    with pytest.raises(TaskError) as err:
        await cache.workspace_tarball(GitSource(repo="o/r", base_commit=commit))
    assert "farm fill-mirror" in str(err.value) and f"pkg/data.bin ({blob[:12]})" in str(err.value)

    # same path, other bytes: nothing is written, the blob is named as still missing (with its path)
    wrong = sdist(tmp_path / "pkg-0.9.tar.gz", {"pkg-0.9/pkg/data.bin": os.urandom(8192)})
    assert main(["fill-mirror", str(mirror), str(wrong), "--commit", commit]) == 1
    out = capsys.readouterr()
    assert f"still missing {blob[:12]} (pkg/data.bin)" in out.out and "0 of 1 missing" in out.err
    assert not has(mirror, blob)

    # a wheel (zip) holding the same bytes under another path: the blob is its bytes
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("pkg/__init__.py", "x = 1\n")
        z.writestr("pkg/renamed.bin", data)
    assert main(["fill-mirror", str(mirror), str(wrong), str(wheel)]) == 0
    out = capsys.readouterr()
    assert f"filled {blob[:12]} from {wheel.name}:pkg/renamed.bin" in out.out
    assert "1 of 1 missing object(s) of every ref's history filled" in out.err
    assert has(mirror, blob)
    git(tmp_path, "--git-dir", str(mirror), "fsck", "--no-dangling")  # the mirror is whole and sound
    ws = await cache.workspace_tarball(GitSource(repo="o/r", base_commit=commit))
    with tarfile.open(ws) as t:
        t.extractall(tmp_path / "ws", filter="data")
    assert (tmp_path / "ws" / "pkg" / "data.bin").read_bytes() == data

    # nothing missing any more: a directory source is read, nothing is filled, exit 0
    assert main(["fill-mirror", str(mirror), str(tmp_path / "work")]) == 0
    assert "0 of 0 missing" in capsys.readouterr().err


def test_bad_arguments_are_named(tmp_path, capsys):
    mirror, _, _ = snapshot(tmp_path, os.urandom(64))
    assert main(["fill-mirror", str(tmp_path / "nowhere.git"), str(tmp_path)]) == 2
    assert "not a git repository" in capsys.readouterr().err
    assert main(["fill-mirror", str(mirror), str(tmp_path / "absent.tar.gz")]) == 2
    assert "absent.tar.gz: no such file or directory" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("not an archive")
    assert main(["fill-mirror", str(mirror), str(tmp_path / "notes.txt")]) == 2
    assert "not a directory, a tar archive or a zip archive" in capsys.readouterr().err
