"""Host-side repository cache: mirrors first, one fetch per repo, one tarball per commit.

Where a repository comes from, in order:

1. ``<mirror_dir>/<owner>__<repo>.git`` for each configured mirror directory (bare
   mirrors; clusters without GitHub access only need these);
2. the task's ``url`` when it is a path on this host;
3. ``<cache_dir>/repos/<owner>__<repo>.git``, cloned once from the task's ``url`` (or
   ``https://github.com/<owner>/<repo>.git``) when ``fetch`` is on (``tasks.fetch``: off
   unless asked).

A missing repository or base commit is a ``TaskError`` naming the task's repo and where
farm looked (``RepositoryNotFound`` / ``CommitNotFound``: deterministic, never retried; a
failed clone is not known to be, so it is). A SWE-smith row's repository is
``swesmith/<owner>__<repo>.<commit>``: its mirror is ``swesmith__<owner>__<repo>.<commit>.git``.

Each (repository, base commit[, pre-patch]) becomes one **workspace tarball** in
``<cache_dir>/workspaces/``: a fresh repo holding *only* the objects reachable from the
base commit (``git fetch <mirror> <sha>``: no later commits, tags or branches, so an
agent cannot find the fix in the history), checked out on branch ``main``. It is built
once under a lock (in-process and across processes on the host) and then uploaded to
every sandbox with ``Sandbox.upload_tarball`` — a local extraction for LocalSandbox, an
upload for E2B — so 16 parallel rollouts of one task fetch nothing. The tarballs are kept
(~100-300 MB a SWE-bench commit) unless ``tasks.workspaces_max_bytes`` bounds them: then the
least-recently-used ones go after each build, and one is built again when asked.

**Imperfect mirrors.** A mirror made with large blobs left out (a partial clone, or a
snapshot missing big files) cannot pack a commit's whole history: ``git fetch`` dies on
the first object it lacks, often one of an old commit. Then the workspace is built from
the base commit alone (``fetch --depth=1``: the commit and its tree, one commit of history,
so the future stays hidden as before). Only when the base commit's own tree lacks objects
does the task fail, with the missing paths and blob ids named. A partial clone's promisor
remote is asked once for the missing blobs of that tree first (what git itself would
fetch lazily); its history is never fetched for a workspace.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import logging
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from farm.errors import CommitNotFound, RepositoryNotFound, TaskError, TaskSourceError, disk_full, says_disk_full
from farm.tasks.model import GitSource

log = logging.getLogger(__name__)

# farm's fixed git identity and dates: the same commits (ids) on every machine, host or sandbox.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "farm",
    "GIT_AUTHOR_EMAIL": "farm@localhost",
    "GIT_COMMITTER_NAME": "farm",
    "GIT_COMMITTER_EMAIL": "farm@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}


async def run_host(
    argv: Sequence[str], *, cwd: str | Path | None = None, timeout: float, stdin: bytes | None = None,
    tail: int | None = 2000,
) -> tuple[int, str]:
    """Run a host command (git, mostly) in a minimal environment (none of farm's own variables);
    returns (exit code, stderr + stdout: its last ``tail`` characters, or all of stdout alone
    with ``tail=None``). A timeout or a cancellation kills its process group."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "GIT_TERMINAL_PROMPT": "0",
        "LANG": "C.UTF-8",
        **GIT_IDENTITY,
    }
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except (TimeoutError, asyncio.CancelledError):
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        await proc.wait()
        raise
    if tail is None:
        return proc.returncode or 0, out.decode(errors="replace") if proc.returncode == 0 else err.decode(errors="replace")
    text = (err.decode(errors="replace") + out.decode(errors="replace")).strip()
    return proc.returncode or 0, text[-tail:]


class FileLock:
    """An exclusive ``flock`` on a lock file, polled so the wait has a timeout."""

    def __init__(self, path: Path, timeout: float) -> None:
        self._path, self._timeout, self._fd = path, timeout, -1

    async def __aenter__(self) -> "FileLock":
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise TaskError(f"timed out after {self._timeout:g} s waiting for lock {self._path}") from None
                await asyncio.sleep(0.05)

    async def __aexit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


class RepoCache:
    """Finds repositories and builds per-commit workspace tarballs on the host."""

    def __init__(
        self,
        *,
        cache_dir: str | Path,
        mirror_dirs: Sequence[str | Path] = (),
        fetch: bool = False,
        git_timeout_s: float = 900.0,
        workspaces_max_bytes: int | None = None,
    ) -> None:
        self.cache_dir = Path(os.path.expanduser(str(cache_dir)))
        self.workspaces_max_bytes = workspaces_max_bytes
        self.mirror_dirs = [Path(os.path.expanduser(str(d))) for d in mirror_dirs]
        self.fetch = fetch
        self.git_timeout_s = git_timeout_s
        self._locks: dict[str, asyncio.Lock] = {}
        self._resolved: set[tuple[Path, str]] = set()
        self._clone_failed: dict[str, tuple[int, str]] = {}  # url -> (failed clones, the last one's reason)

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    # --- locating ----------------------------------------------------------------
    def _name(self, source: GitSource) -> str:
        if source.mirror_name:
            return source.mirror_name
        digest = hashlib.sha1(str(source.url).encode()).hexdigest()[:12]
        stem = Path(str(source.url).rstrip("/")).name.removesuffix(".git") or "repo"
        return f"url__{stem}-{digest}.git"

    async def locate(self, source: GitSource) -> Path:
        """The host path of a git repository holding the source (mirror, local url, or fetched)."""
        looked: list[str] = []
        if source.mirror_name:
            for d in self.mirror_dirs:
                cand = d / source.mirror_name
                looked.append(str(cand))
                if cand.is_dir():
                    return cand
        if source.url and not _is_remote(source.url):
            path = Path(os.path.expanduser(source.url.removeprefix("file://")))
            looked.append(str(path))
            if path.is_dir():
                return path
        cached = self.cache_dir / "repos" / self._name(source)
        looked.append(str(cached))
        if cached.is_dir():
            return cached
        url = source.url if source.url and _is_remote(source.url) else None
        if url is None and source.repo:
            url = f"https://github.com/{source.repo}.git"
        what = source.repo or source.url
        if not self.fetch or url is None:
            why = "fetching is off (tasks.fetch)" if url is not None else "no url to fetch it from"
            raise RepositoryNotFound(f"repository {what} not found (looked in: {', '.join(looked)}; {why})")
        failures_before = self._clone_failed.get(url, (0, ""))[0]
        async with self._lock(str(cached)), FileLock(cached.with_suffix(".lock"), self.git_timeout_s):
            if cached.is_dir():
                return cached
            failures, failed = self._clone_failed.get(url, (0, ""))
            if failures > failures_before:  # it failed for another task while this one waited: not cloned twice at once
                raise TaskError(failed)
            tmp = cached.parent / f".tmp-{uuid.uuid4().hex}"
            tmp.parent.mkdir(parents=True, exist_ok=True)
            try:
                code, out = await run_host(["git", "clone", "--quiet", "--mirror", url, str(tmp)], timeout=self.git_timeout_s)
            except TimeoutError:
                code, out = -1, f"timed out after {self.git_timeout_s:g} s"
            if code != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                # not known to be deterministic (the network may come back): retried like any infrastructure failure
                failed = f"repository {what} not found (looked in: {', '.join(looked)}); cloning {url} failed: {out}"
                self._clone_failed[url] = (self._clone_failed.get(url, (0, ""))[0] + 1, failed)
                raise TaskError(failed)
            os.replace(tmp, cached)
        return cached

    async def resolve_commit(self, repo: Path, commit: str, what: str) -> str:
        if (repo, commit) in self._resolved:  # a full commit id that was there stays there
            return commit
        code, out = await run_host(
            ["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=repo, timeout=60
        )
        sha = out.strip().splitlines()[-1] if out.strip() else ""
        if code != 0 or len(sha) != 40:
            raise CommitNotFound(f"repository {what}: base commit {commit} not found in {repo}")
        if sha == commit:
            self._resolved.add((repo, commit))
        return sha

    # --- workspace tarballs ----------------------------------------------------------
    async def workspace_tarball(self, source: GitSource, pre_patch: str | None = None) -> Path:
        """A tar of a checkout at the base commit (``main`` branch, only its history).

        With ``pre_patch``: the patch applied and committed as a parentless commit, the
        original objects pruned (the agent sees one commit and no way back).
        """
        repo = await self.locate(source)
        what = source.repo or str(source.url)
        sha = await self.resolve_commit(repo, source.base_commit, what)
        suffix = "" if not pre_patch else "-" + hashlib.sha1(pre_patch.encode()).hexdigest()[:12]
        out = self.cache_dir / "workspaces" / self._name(source).removesuffix(".git") / f"{sha}{suffix}.tar"
        if _used(out):
            return out
        async with self._lock(str(out)), FileLock(out.with_suffix(".lock"), self.git_timeout_s):
            if _used(out):
                return out
            build = self.cache_dir / "tmp" / uuid.uuid4().hex
            try:
                await self._build(repo, sha, pre_patch, build / "ws", what)
                tmp_tar = out.parent / f".tmp-{uuid.uuid4().hex}.tar"
                out.parent.mkdir(parents=True, exist_ok=True)
                await asyncio.to_thread(_tar_dir, build / "ws", tmp_tar)
                os.replace(tmp_tar, out)
            finally:
                shutil.rmtree(build, ignore_errors=True)
        if self.workspaces_max_bytes is not None:
            removed = await asyncio.to_thread(evict_workspaces, self.cache_dir / "workspaces", self.workspaces_max_bytes)
            if removed:
                log.info("tasks: removed %d least-recently-used workspace tarball(s) to fit tasks.workspaces_max_bytes",
                         len(removed))  # fmt: skip
        return out

    async def _build(self, repo: Path, sha: str, pre_patch: str | None, ws: Path, what: str) -> None:
        ws.mkdir(parents=True)
        t = self.git_timeout_s

        async def git(*args: str, stdin: bytes | None = None) -> str:
            try:
                code, out = await run_host(["git", *args], cwd=ws, timeout=t, stdin=stdin)
            except TimeoutError:
                raise _GitTimeout(f"repository {what}: 'git {args[0]}' timed out after {t:g} s") from None
            if code != 0 and says_disk_full(out):  # not the mirror's fault: no "cannot pack its history" either
                raise disk_full(f"repository {what}: 'git {' '.join(args[:3])}' while building a workspace", out)
            if code != 0:
                raise TaskError(f"repository {what}: 'git {' '.join(args[:3])}' failed: {out}")
            return out

        await git("init", "--quiet", "--initial-branch=main")
        fetch = ["-c", "uploadpack.allowAnySHA1InWant=true", "fetch", "--quiet", "--no-tags"]
        promisor = await self._promisor_remote(repo)
        history_error = "the mirror is a partial clone: its history is never packed" if promisor else ""
        if not promisor:
            try:
                await git(*fetch, str(repo.resolve()), sha)
            except _GitTimeout:
                raise
            except TaskError as exc:
                history_error = _gist(str(exc).removeprefix(f"repository {what}: "))
        if history_error:
            await self._complete_tree(repo, sha, promisor, what, history_error)
            try:
                await git(*fetch, "--depth=1", str(repo.resolve()), sha)
            except TaskError as exc:
                raise TaskError(f"{exc}; before that, the full history: {history_error}") from None
            log.info("repository %s: workspace at %s from the base commit alone (%s)", what, sha[:12], history_error[:200])
        await git("-c", "advice.detachedHead=false", "checkout", "--quiet", "-B", "main", sha)
        if pre_patch:
            try:
                await git("apply", "--index", "--whitespace=nowarn", "-", stdin=pre_patch.encode())
            except TaskError as exc:
                raise TaskSourceError(f"repository {what}: the task's pre_patch does not apply at {sha[:12]}: {exc}") from None
            tree = (await git("write-tree")).strip().splitlines()[-1]
            commit = (await git("commit-tree", tree, "-m", "task base")).strip().splitlines()[-1]
            await git("reset", "--quiet", "--hard", commit)
        await git("config", "user.name", "farm")
        await git("config", "user.email", "farm@localhost")
        await git("reflog", "expire", "--expire=now", "--all")
        if pre_patch:
            await git("gc", "--quiet", "--prune=now")
        (ws / ".git" / "FETCH_HEAD").unlink(missing_ok=True)

    async def _promisor_remote(self, repo: Path) -> str | None:
        """The remote a partial clone fetches its missing objects from (None: not one)."""
        code, out = await run_host(["git", "config", "--get", "extensions.partialClone"], cwd=repo, timeout=60)
        if code == 0 and out.strip():
            return out.strip()
        code, out = await run_host(["git", "config", "--bool", "--get-regexp", r"^remote\..*\.promisor$"], cwd=repo, timeout=60)
        promisors = [ln.split()[0][len("remote.") : -len(".promisor")] for ln in out.splitlines() if ln.endswith(" true")]
        return promisors[0] if code == 0 and promisors else None

    async def _missing_in_tree(self, repo: Path, sha: str) -> dict[str, list[str]]:
        """Objects of ``sha``'s tree the repository lacks: {object id: [paths]} (never fetched lazily)."""
        code, out = await run_host(
            ["git", "rev-list", "--objects", "--missing=print", f"{sha}^{{tree}}"], cwd=repo, timeout=self.git_timeout_s,
            tail=None,
        )
        if code != 0:
            raise TaskError(f"cannot list the tree of {sha[:12]} in {repo}: {out[-500:]}")
        missing = missing_ids(out)
        if missing:
            _, listing = await run_host(["git", "ls-tree", "-r", "-t", "-z", sha], cwd=repo, timeout=self.git_timeout_s, tail=None)
            name_paths(missing, listing)
        return missing

    async def _complete_tree(self, repo: Path, sha: str, promisor: str | None, what: str, history_error: str) -> None:
        """Make sure every object of ``sha``'s tree is in ``repo`` (asking a partial clone's
        promisor remote for what it lacks, once); else a TaskError naming what is missing."""
        missing = await self._missing_in_tree(repo, sha)
        asked = ""
        if missing and promisor:
            code, out = await run_host(
                ["git", "-c", "fetch.negotiationAlgorithm=noop", "fetch", "--quiet", "--no-tags", "--no-write-fetch-head",
                 "--recurse-submodules=no", "--filter=blob:none", "--stdin", promisor],
                cwd=repo, timeout=self.git_timeout_s, stdin="".join(f"{oid}\n" for oid in missing).encode(),
            )  # fmt: skip
            asked = f"; its promisor remote {promisor!r} was asked for them: " + ("they did not come" if code == 0 else out[-300:])
            missing = await self._missing_in_tree(repo, sha)
        if not missing:
            return
        shown = [f"{', '.join(paths) or '?'} ({oid[:12]})" for oid, paths in sorted(missing.items(), key=lambda kv: kv[1])]
        raise IncompleteTree(what=what, commit=sha, repo=repo, missing=shown, detail=f"{asked} (its history cannot be "
                             f"packed either: {history_error})")  # fmt: skip


class IncompleteTree(TaskSourceError):
    """A commit's tree lacks objects in the mirror: the paths and blob ids are named. ``describe``
    says which commit it is to the task (its base commit, or the commit its base environment
    is built at)."""

    def __init__(self, *, what: str, commit: str, repo: Path, missing: list[str], detail: str) -> None:
        self.what, self.commit, self.repo, self.missing, self.detail = what, commit, repo, missing, detail
        super().__init__(self.describe("base commit"))

    def describe(self, role: str) -> str:
        more = f" and {len(self.missing) - 20} more" if len(self.missing) > 20 else ""
        return (
            f"repository {self.what}: the tree of {role} {self.commit[:12]} is incomplete in {self.repo}: "
            f"{len(self.missing)} object(s) missing: {'; '.join(self.missing[:20])}{more}{self.detail}. "
            "The mirror lacks objects (e.g. made with large blobs left out): fetch them into it, fill them from a "
            "release's files (`farm fill-mirror MIRROR SDIST`), or use a complete mirror"
        )


def _gist(text: str) -> str:
    """The telling line of git's output (the object it could not read), else its last line."""
    lines = [ln.strip().removeprefix("remote: ").strip() for ln in text.splitlines() if ln.strip()]
    telling = [ln for ln in lines if any(w in ln for w in ("unable to read", "missing", "bad object", "did not send"))]
    return (telling or lines or [""])[0 if telling else -1][:300]


class _GitTimeout(TaskError):
    """A host git command ran out of time (not a sign of a broken mirror: never retried)."""


def _is_remote(url: str) -> bool:
    return "://" in url and not url.startswith("file://") or (":" in url.split("/", 1)[0] and "@" in url)


def missing_ids(rev_list: str) -> dict[str, list[str]]:
    """The objects ``git rev-list --objects --missing=print`` says are missing: {id: []}."""
    return {line[1:].strip(): [] for line in rev_list.splitlines() if line.startswith("?")}


def name_paths(missing: dict[str, list[str]], listing: str) -> None:
    """Add to each missing id the paths ``git ls-tree -r -z`` gives it (once each)."""
    for entry in listing.split("\0"):
        meta, _, path = entry.partition("\t")
        oid = meta.split(" ")[-1] if meta else ""
        if oid in missing and path not in missing[oid]:
            missing[oid].append(path)


IN_USE_S = 600.0  # a tarball used this recently may be unpacking into a sandbox: never evicted


def _used(tar: Path) -> bool:
    """Is the tarball there? Then it is marked used now (its mtime: what eviction orders by)."""
    try:
        os.utime(tar)
    except FileNotFoundError:
        return False
    except OSError:  # a cache this process may read but not touch (read-only, another user's)
        return tar.is_file()
    return True


def evict_workspaces(root: Path, max_bytes: int, *, now: float | None = None) -> list[Path]:
    """Remove the least-recently-used workspace tarballs under ``root`` until they hold at most
    ``max_bytes``; none used in the last ``IN_USE_S`` seconds. The removed paths, oldest first."""
    now = time.time() if now is None else now
    tars = []
    for tar in root.glob("*/*.tar"):
        try:
            st = tar.stat()
        except FileNotFoundError:  # another process evicted it meanwhile
            continue
        tars.append((st.st_mtime, st.st_size, tar))
    tars.sort()
    total = sum(size for _, size, _ in tars)
    removed = []
    for mtime, size, tar in tars:
        if total <= max_bytes or mtime > now - IN_USE_S:
            break
        tar.unlink(missing_ok=True)
        total -= size
        removed.append(tar)
    return removed


def _tar_dir(src: Path, dest: Path) -> None:
    with tarfile.open(dest, "w") as tar:
        for entry in sorted(os.listdir(src)):
            tar.add(src / entry, arcname=entry)
