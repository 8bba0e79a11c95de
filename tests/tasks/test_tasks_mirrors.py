"""Imperfect mirrors: a history that cannot be packed (objects left out of the mirror)
still gives a workspace at the base commit, from the commit and its tree alone, with no
later history; a tree that is itself incomplete fails naming the missing paths and blobs.
The broken mirrors are made here with git: a deleted object, a partial clone."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from farm.errors import TaskError
from farm.tasks.model import GitSource
from farm.tasks.repos import RepoCache

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=ENV, capture_output=True, text=True, check=True).stdout.strip()


def history(root: Path) -> dict[str, str]:
    """A repo: c1 adds big.bin (a 4 KB blob), c2 deletes it (the base), c3 is the future;
    returns the commits and the blob's id."""
    work = root / "work"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    (work / "a.py").write_text("x = 1\n")
    (work / "big.bin").write_bytes(os.urandom(4096))
    git(work, "add", "-A")
    git(work, "commit", "-qm", "c1: data")
    blob = git(work, "rev-parse", "HEAD:big.bin")
    git(work, "rm", "-q", "big.bin")
    (work / "a.py").write_text("x = 2\n")
    git(work, "commit", "-qam", "c2: base")
    (work / "a.py").write_text("x = 3  # the fix\n")
    git(work, "commit", "-qam", "c3: the future")
    return {"work": str(work), "c1": git(work, "rev-parse", "HEAD~2"), "c2": git(work, "rev-parse", "HEAD~1"),
            "c3": git(work, "rev-parse", "HEAD"), "blob": blob}  # fmt: skip


def bare_mirror(work: str, mirrors: Path) -> Path:
    """A bare mirror with loose objects (so one can be deleted)."""
    m = mirrors / "o__r.git"
    git(mirrors.parent, "init", "-q", "--bare", str(m))
    git(Path(work), "push", "-q", str(m), "main")
    return m


def drop(mirror: Path, oid: str) -> None:
    (mirror / "objects" / oid[:2] / oid[2:]).unlink()


def unpack(tar: Path, dest: Path) -> Path:
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return dest


async def test_history_missing_a_blob_gives_the_base_commit_alone(tmp_path):
    h = history(tmp_path)
    mirror = bare_mirror(h["work"], tmp_path / "mirrors")
    drop(mirror, h["blob"])  # the old commit's blob: the history cannot be packed any more
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=[tmp_path / "mirrors"], fetch=False)
    ws = unpack(await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c2"])), tmp_path / "ws")
    assert git(ws, "rev-parse", "HEAD") == h["c2"]  # the real base commit, its own tree
    assert git(ws, "rev-parse", "HEAD^{tree}") == git(Path(h["work"]), "rev-parse", f"{h['c2']}^{{tree}}")
    assert git(ws, "log", "--format=%s") == "c2: base"  # one commit of history
    assert (ws / "a.py").read_text() == "x = 2\n" and git(ws, "status", "--porcelain") == ""
    r = subprocess.run(["git", "cat-file", "-e", h["c3"]], cwd=ws, capture_output=True)
    assert r.returncode != 0  # the future is not there
    r = subprocess.run(["git", "cat-file", "-e", h["c1"]], cwd=ws, capture_output=True)
    assert r.returncode != 0  # nor the past beyond the base commit


async def test_a_pre_patch_on_a_history_that_cannot_be_packed(tmp_path):
    h = history(tmp_path)
    mirror = bare_mirror(h["work"], tmp_path / "mirrors")
    drop(mirror, h["blob"])
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=[tmp_path / "mirrors"], fetch=False)
    patch = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 2\n+x = 20\n"
    ws = unpack(await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c2"]), patch), tmp_path / "ws")
    assert (ws / "a.py").read_text() == "x = 20\n"
    assert git(ws, "log", "--format=%s") == "task base"
    r = subprocess.run(["git", "cat-file", "-e", h["c2"]], cwd=ws, capture_output=True)
    assert r.returncode != 0  # the original commit is gone too


async def test_a_tree_missing_a_blob_names_it(tmp_path):
    h = history(tmp_path)
    mirror = bare_mirror(h["work"], tmp_path / "mirrors")
    drop(mirror, h["blob"])
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=[tmp_path / "mirrors"], fetch=False)
    with pytest.raises(TaskError) as err:
        await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c1"]))  # big.bin is in c1's tree
    msg = str(err.value)
    assert f"tree of base commit {h['c1'][:12]} is incomplete" in msg
    assert f"big.bin ({h['blob'][:12]})" in msg and "1 object(s) missing" in msg
    assert f"unable to read {h['blob']}" in msg  # why the history was not enough either
    assert not list((tmp_path / "cache" / "workspaces").glob("*/*.tar"))


async def test_a_partial_clone_mirror(tmp_path):
    """A partial clone (blobs over 1 KB left out) never packs its history; a base tree it
    holds whole builds at once; one it lacks blobs of is completed from its promisor
    remote; with the remote gone, the missing paths are named."""
    h = history(tmp_path)
    origin = Path(h["work"])
    git(origin, "config", "uploadpack.allowFilter", "true")
    git(origin, "config", "uploadpack.allowAnySHA1InWant", "true")
    mirrors = tmp_path / "mirrors"
    mirrors.mkdir()
    git(tmp_path, "clone", "-q", "--bare", "--filter=blob:limit=1k", f"file://{origin}", str(mirrors / "o__r.git"))
    mirror = mirrors / "o__r.git"
    assert f"?{h['blob']}" in git(mirror, "rev-list", "--objects", "--missing=print", "--all")  # left out
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=[mirrors], fetch=False)
    ws = unpack(await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c2"])), tmp_path / "ws2")
    assert git(ws, "log", "--format=%s") == "c2: base" and (ws / "a.py").read_text() == "x = 2\n"
    ws = unpack(await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c1"])), tmp_path / "ws1")
    assert git(ws, "rev-parse", "HEAD") == h["c1"] and len((ws / "big.bin").read_bytes()) == 4096  # from the remote
    # a new big blob the mirror never saw, and the promisor remote gone
    (origin / "big2.bin").write_bytes(os.urandom(4096))
    git(origin, "add", "-A")
    git(origin, "commit", "-qm", "c4: more data")
    git(mirror, "fetch", "-q", "--filter=blob:limit=1k", "origin", "main:main")
    c4 = git(origin, "rev-parse", "HEAD")
    blob2 = git(origin, "rev-parse", "HEAD:big2.bin")
    os.rename(origin, tmp_path / "gone")
    with pytest.raises(TaskError) as err:
        await cache.workspace_tarball(GitSource(repo="o/r", base_commit=c4))
    msg = str(err.value)
    assert f"big2.bin ({blob2[:12]})" in msg and "promisor remote 'origin'" in msg and "partial clone" in msg


async def test_workspace_tarballs_are_bounded_least_recently_used_first(tmp_path):
    """With ``tasks.workspaces_max_bytes`` a build removes the least-recently-used tarballs until
    they fit, never one used in the last IN_USE_S (a sandbox may be unpacking it); a removed one
    is built again when asked. Without a bound nothing is removed."""
    import time

    from farm.tasks.repos import IN_USE_S

    h = history(tmp_path)
    bare_mirror(h["work"], tmp_path / "mirrors")
    cache = RepoCache(cache_dir=tmp_path / "cache", mirror_dirs=[tmp_path / "mirrors"], workspaces_max_bytes=1)
    long_ago = time.time() - 2 * IN_USE_S
    c1 = await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c1"]))
    c2 = await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c2"]))
    assert c1.is_file() and c2.is_file()  # both used just now: over the bound, and kept
    os.utime(c1, (long_ago, long_ago))
    os.utime(c2, (long_ago, long_ago))
    assert await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c2"])) == c2  # asked again: used now
    c3 = await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c3"]))  # a build: c1 is the one to go
    assert not c1.exists() and c2.is_file() and c3.is_file()
    again = await cache.workspace_tarball(GitSource(repo="o/r", base_commit=h["c1"]))
    assert again == c1 and unpack(again, tmp_path / "ws").joinpath("big.bin").is_file()

    unbounded = RepoCache(cache_dir=tmp_path / "cache2", mirror_dirs=[tmp_path / "mirrors"])
    old = await unbounded.workspace_tarball(GitSource(repo="o/r", base_commit=h["c1"]))
    os.utime(old, (long_ago, long_ago))
    await unbounded.workspace_tarball(GitSource(repo="o/r", base_commit=h["c2"]))
    assert old.is_file()
