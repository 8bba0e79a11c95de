"""Pure helpers over unified diffs (git-style or plain): which paths a diff touches, and
its reverse (SWE-smith ships the bug-introducing patch; the gold fix is its reverse).

Written by hand because the few libraries that parse diffs (``unidiff``) cannot reverse
them and lose git's extended headers (modes, renames); this handles what ``git diff``
emits and what ``git apply`` / ``patch`` accept, and is tested by round trips through
real git.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HUNK_RE = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")
_INDEX_RE = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "a": "\a", "b": "\b", "f": "\f", "r": "\r", "v": "\v"}


@dataclass(frozen=True)
class FileChange:
    """One file of a diff. ``None`` stands for /dev/null (a new or a deleted file)."""

    old_path: str | None
    new_path: str | None

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p for p in (self.old_path, self.new_path) if p))


def _unquote(path: str) -> str:
    """git's C-style quoted path (``"a/f\\303\\251"``) to text."""
    if not (len(path) >= 2 and path[0] == '"' and path[-1] == '"'):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1 and re.fullmatch(r"[0-7]{3}", body[i + 1 : i + 4]):
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            out.extend(_ESCAPES.get(nxt, nxt).encode())
            i += 2
            continue
        out.extend(ch.encode())
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _strip_prefix(path: str) -> str | None:
    path = path.split("\t", 1)[0].rstrip("\r")
    path = _unquote(path)
    if path == "/dev/null":
        return None
    if path[:2] in ("a/", "b/"):
        return path[2:]
    return path


def _git_header_paths(line: str) -> tuple[str | None, str | None]:
    rest = line[len("diff --git ") :].rstrip("\r")
    if rest.startswith('"'):
        m = re.match(r'^("(?:[^"\\]|\\.)*")\s+(.*)$', rest)
        if m:
            return _strip_prefix(m.group(1)), _strip_prefix(m.group(2))
    # Unquoted: "a/X b/X" (same path when not renamed): split in the middle.
    if rest.startswith("a/") and " b/" in rest:
        half = (len(rest) - 1) // 2
        if rest[half] == " " and rest[2:half] == rest[half + 3 :]:
            return rest[2:half], rest[half + 3 :]
        idx = rest.index(" b/")
        return rest[2:idx], rest[idx + 3 :]
    parts = rest.split(" ")
    return (_strip_prefix(parts[0]), _strip_prefix(parts[-1])) if len(parts) >= 2 else (None, None)


def parse_files(diff: str) -> list[FileChange]:
    """Every file a diff touches, in order."""
    return [change for change, _, _ in file_sections(diff)]


def file_sections(diff: str) -> list[tuple[FileChange, int, int]]:
    """Every file a diff touches with the lines of its section: (change, first, end) over
    ``diff.splitlines()`` (``end`` exclusive), in order."""
    files: list[tuple[FileChange, int, int]] = []
    old: str | None = None
    new: str | None = None
    in_git = False
    have_minus = False
    start = 0

    def flush(end: int) -> None:
        nonlocal old, new
        if old is not None or new is not None:
            files.append((FileChange(old, new), start, end))
        old = new = None

    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            flush(i)
            start = i
            old, new = _git_header_paths(line)
            in_git, have_minus = True, False
        elif line.startswith("rename from ") or line.startswith("copy from "):
            old = _unquote(line.split(" from ", 1)[1])
        elif line.startswith("rename to ") or line.startswith("copy to "):
            new = _unquote(line.split(" to ", 1)[1])
        elif line.startswith("new file mode"):
            old = None
        elif line.startswith("deleted file mode"):
            new = None
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            minus, plus = _strip_prefix(line[4:]), _strip_prefix(lines[i + 1][4:])
            if not in_git or have_minus:
                flush(i)
                start = i
            old, new, have_minus = minus, plus, True
            i += 2
            continue
        elif line.startswith("@@"):
            # Skip the hunk body so '--- '-looking removed lines are not taken for headers.
            i = _skip_hunk(lines, i)
            continue
        i += 1
    flush(len(lines))
    return files


def _skip_hunk(lines: list[str], i: int) -> int:
    m = _HUNK_RE.match(lines[i].rstrip("\r"))
    if not m:
        return i + 1
    old_n = _count(m.group(1))
    new_n = _count(m.group(2))
    i += 1
    while i < len(lines) and (old_n > 0 or new_n > 0):
        tag = lines[i][:1]
        if tag == "-":
            old_n -= 1
        elif tag == "+":
            new_n -= 1
        elif tag in (" ", ""):
            old_n -= 1
            new_n -= 1
        elif tag != "\\":
            break
        i += 1
    while i < len(lines) and lines[i].startswith("\\"):
        i += 1
    return i


def _count(spec: str) -> int:
    return int(spec.split(",")[1]) if "," in spec else 1


# Files a test run or a tool leaves in a checkout (bytecode, test runners' and linters'
# caches, coverage data, build metadata): never the agent's work, and never graded. A
# forged ``.pyc`` beside an unchanged source would even run code the diff does not show.
CACHE_GLOBS = (
    "**/__pycache__/**", "**/*.pyc", "**/*.pyo", "**/.pytest_cache/**", "**/.hypothesis/**", "**/.mypy_cache/**",
    "**/.ruff_cache/**", "**/.tox/**", "**/.nox/**", "**/.coverage", "**/.coverage.*", "**/htmlcov/**",
    "**/*.egg-info/**", "**/.eggs/**",
)  # fmt: skip
_CACHE_DIRS = frozenset({"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache", ".tox", ".nox",
                         "htmlcov", ".eggs"})  # fmt: skip


def is_cache_path(path: str) -> bool:
    """Does ``path`` (relative to the checkout) match ``CACHE_GLOBS``?"""
    parts = path.split("/")
    name = parts[-1]
    if name.endswith((".pyc", ".pyo")) or name == ".coverage" or name.startswith(".coverage."):
        return True
    return any(p in _CACHE_DIRS or p.endswith(".egg-info") for p in parts[:-1])


def drop_files(diff: str, drop) -> tuple[str, list[str]]:  # noqa: ANN001 - a predicate over paths
    """``diff`` without the sections of the files for which ``drop(path)`` holds on every
    path they name, and those paths."""
    lines = diff.splitlines(keepends=True)
    sections = file_sections(diff)
    gone = [(a, b, c) for c, a, b in sections if c.paths and all(drop(p) for p in c.paths)]
    if not gone:
        return diff, []
    keep, at = [], 0
    for a, b, _ in gone:
        keep.extend(lines[at:a])
        at = b
    keep.extend(lines[at:])
    return "".join(keep), [p for _, _, c in gone for p in c.paths]


def touched_paths(diff: str) -> list[str]:
    """Every path (old and new side) a diff reads or writes, de-duplicated, in order."""
    return list(dict.fromkeys(p for f in parse_files(diff) for p in f.paths))


def paths_after(diff: str) -> list[str]:
    """The paths the diff leaves in the tree: each file's new path (a rename's target, not
    its source), none for a deleted file."""
    return list(dict.fromkeys(f.new_path for f in parse_files(diff) if f.new_path))


def is_empty(diff: str | None) -> bool:
    return not diff or not diff.strip()


def reverse_patch(diff: str) -> str:
    """The diff that undoes ``diff`` (git-style or plain unified). Binary patches and copies
    cannot be reversed from the text alone: ``ValueError``."""
    out: list[str] = []
    lines = diff.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            old, new = _git_header_paths(line)
            out.append(f"diff --git a/{new} b/{old}")
        elif line.startswith("GIT binary patch") or line.startswith("Binary files "):
            raise ValueError("cannot reverse a binary patch")
        elif line.startswith("copy from ") or line.startswith("copy to "):
            raise ValueError("cannot reverse a copy")
        elif line.startswith("new file mode "):
            out.append("deleted file mode " + line[len("new file mode ") :])
        elif line.startswith("deleted file mode "):
            out.append("new file mode " + line[len("deleted file mode ") :])
        elif line.startswith("old mode ") and i + 1 < len(lines) and lines[i + 1].startswith("new mode "):
            out.append("old mode " + lines[i + 1][len("new mode ") :])
            out.append("new mode " + line[len("old mode ") :])
            i += 2
            continue
        elif line.startswith("rename from ") and i + 1 < len(lines) and lines[i + 1].startswith("rename to "):
            out.append("rename from " + lines[i + 1][len("rename to ") :])
            out.append("rename to " + line[len("rename from ") :])
            i += 2
            continue
        elif _INDEX_RE.match(line):
            m = _INDEX_RE.match(line)
            assert m is not None
            out.append(f"index {m.group(2)}..{m.group(1)}{m.group(3)}")
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            minus, plus = line[4:], lines[i + 1][4:]
            out.append("--- " + _swap_side(plus, "a/"))
            out.append("+++ " + _swap_side(minus, "b/"))
            i += 2
            continue
        elif line.startswith("@@"):
            i = _reverse_hunk(lines, i, out)
            continue
        else:
            out.append(line)
        i += 1
    text = "\n".join(out)
    return text + "\n" if diff.endswith("\n") or text else text


def _swap_side(spec: str, prefix: str) -> str:
    """Re-prefix a ---/+++ path for the other side (a/ <-> b/), keeping /dev/null and tabs."""
    path, tab, rest = spec.partition("\t")
    if path == "/dev/null":
        return spec
    quoted = path.startswith('"')
    body = path[1:-1] if quoted else path
    if body[:2] in ("a/", "b/"):
        body = prefix + body[2:]
    path = f'"{body}"' if quoted else body
    return path + tab + rest


def _reverse_hunk(lines: list[str], i: int, out: list[str]) -> int:
    m = _HUNK_RE.match(lines[i].rstrip("\r"))
    if not m:
        out.append(lines[i])
        return i + 1
    out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}")
    old_n, new_n = _count(m.group(1)), _count(m.group(2))
    i += 1
    minus: list[str] = []  # becomes '+' (was '-')
    plus: list[str] = []  # becomes '-' (was '+')

    def flush() -> None:
        out.extend(plus)
        out.extend(minus)
        plus.clear()
        minus.clear()

    last: list[str] | None = None
    while i < len(lines) and (old_n > 0 or new_n > 0 or lines[i].startswith("\\")):
        line = lines[i]
        tag = line[:1]
        if tag == "\\":
            (last if last is not None else out).append(line)
        elif tag == "-":
            minus.append("+" + line[1:])
            last, old_n = minus, old_n - 1
        elif tag == "+":
            plus.append("-" + line[1:])
            last, new_n = plus, new_n - 1
        elif tag in (" ", ""):
            flush()
            out.append(line)
            last, old_n, new_n = out, old_n - 1, new_n - 1
        else:
            break
        i += 1
    flush()
    return i
