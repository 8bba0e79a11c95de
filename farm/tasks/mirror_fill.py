"""Fill the blobs a mirror lacks from a release's own files (a PyPI sdist, a wheel, a directory).

A mirror made without its large files (a snapshot that leaves out files of 4 MiB and more, a
partial clone whose promisor is out of reach) fails every row whose tree holds one of them
(``IncompleteTree``). Those files are most often data that the project's releases ship too:
pvlib's ``LinkeTurbidities.h5``, pydicom's test images. A git blob's id is the hash of its
bytes, so a release's file whose hash is a missing blob's id *is* that blob: it is written
into the mirror (``git hash-object -w``, which hashes it again), and nothing else is. A file
with the same path but other bytes is left alone, so a wrong archive can fill nothing wrong.

Used by ``farm fill-mirror``; the objects that are still missing afterwards are reported.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from farm.errors import TaskError
from farm.tasks.repos import missing_ids, name_paths


@dataclass
class FillReport:
    """What a fill did: the blobs written (id: the archive member they came from) and those still missing."""

    missing_before: int = 0
    filled: dict[str, str] = field(default_factory=dict)
    still_missing: dict[str, list[str]] = field(default_factory=dict)  # id: its paths (where known)


def _git(mirror: Path, *args: str, stdin: bytes | None = None) -> str:
    r = subprocess.run(["git", "--git-dir", str(mirror), *args], input=stdin, capture_output=True, check=False)
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace")[-300:].strip()
        raise TaskError(f"git {' '.join(args[:3])} failed in {mirror}: {err}")
    return r.stdout.decode(errors="replace")


def missing_blobs(mirror: Path, commits: Sequence[str] = ()) -> dict[str, list[str]]:
    """The objects reachable from ``commits`` (default: every ref's history) that ``mirror``
    lacks, with the paths they have in those commits' trees (none when every ref was looked at:
    git names no path for an object it lacks, and walking every tree of a history is slow)."""
    missing = missing_ids(_git(mirror, "rev-list", "--objects", "--missing=print", *(commits or ["--all"])))
    for commit in commits if missing else ():
        name_paths(missing, _git(mirror, "ls-tree", "-r", "-z", commit))
    return missing


def _members(source: Path) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of every regular file of an archive (.tar[.gz|.bz2|.xz], .zip, .whl) or directory."""
    if source.is_dir():
        for root, _, files in os.walk(source):
            for name in files:
                path = Path(root, name)
                if path.is_file() and not path.is_symlink():
                    yield str(path.relative_to(source)), path.read_bytes()
    elif zipfile.is_zipfile(source):
        with zipfile.ZipFile(source) as z:
            for info in z.infolist():
                if not info.is_dir():
                    yield info.filename, z.read(info)
    elif tarfile.is_tarfile(source):
        with tarfile.open(source) as t:
            for member in t:
                f = t.extractfile(member) if member.isfile() else None
                if f is not None:
                    yield member.name, f.read()
    else:
        raise TaskError(f"{source}: not a directory, a tar archive or a zip archive (an sdist or a wheel)")


def blob_id(data: bytes, object_format: str = "sha1") -> str:
    """The id git gives a blob of these bytes."""
    return hashlib.new(object_format, b"blob %d\0" % len(data) + data).hexdigest()


def fill_mirror(mirror: Path, sources: Sequence[Path], commits: Sequence[str] = ()) -> FillReport:
    """Write into ``mirror`` every missing blob (of ``commits``, default every ref's history)
    that a file of ``sources`` is, byte for byte."""
    if not (mirror / "objects").is_dir():
        raise TaskError(f"{mirror}: not a git repository (a bare mirror <owner>__<repo>.git, or a repository's .git)")
    for source in sources:
        if not source.exists():
            raise TaskError(f"{source}: no such file or directory")
    fmt = _git(mirror, "rev-parse", "--show-object-format").strip() or "sha1"
    missing = missing_blobs(mirror, commits)
    report = FillReport(missing_before=len(missing))
    for source in sources:
        if not missing:
            break
        for name, data in _members(source):
            oid = blob_id(data, fmt)
            if oid in missing:
                written = _git(mirror, "hash-object", "-w", "--stdin", stdin=data).strip()
                if written != oid:  # cannot happen unless git and hashlib disagree: say so, write nothing more
                    raise TaskError(f"git wrote {written} for {source}:{name}, expected {oid}")
                report.filled[oid] = f"{source.name}:{name}"
                del missing[oid]
    report.still_missing = missing
    return report
