"""The test surface: the files that decide how tests run and what they report.

They belong to the task, not to the policy. Before the tests run, the grader puts every
surface file the policy's diff touched back to its baseline state (a file the diff added
is removed), then applies the task's test patch, as SWE-bench's evaluation does with the
test files. So a policy that edits or deletes the tests, plants a ``conftest.py`` whose
hooks turn failures into passes, adds ``-p plugin`` to the pytest config, or drops a
``*.pth`` / ``sitecustomize.py`` that patches the test runner, gains nothing; each such
touch is listed in the grading report and raises a flag.

The default surface (a task may replace it with ``test_surface`` glob patterns):
- test code: any path with a ``tests``/``test``/``testing`` directory component,
  ``test_*.py``, ``*_test.py``, and every file the task's test patch touches;
- test configuration and start-up hooks: ``conftest.py`` anywhere, ``pytest.ini``,
  ``.pytest.ini``, ``tox.ini``, ``noxfile.py``, ``sitecustomize.py``,
  ``usercustomize.py``, ``*.pth`` anywhere;
- ``setup.cfg`` / ``pyproject.toml`` when the diff's changed lines there touch pytest's
  configuration (its section header, ``addopts``, ``-p`` and other plugins, what is
  collected, ``filterwarnings``...; not a line that merely names pytest, such as a
  dependency): the whole file is reset (a legitimate change to other parts of it is lost
  with it; documented).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from farm.tasks.patches import parse_files, touched_paths

TEST_DIRS = frozenset({"tests", "test", "testing"})
SURFACE_NAMES = (
    "test_*.py", "*_test.py", "conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "noxfile.py",
    "sitecustomize.py", "usercustomize.py", "*.pth",
)  # fmt: skip
CONFIG_FILES = frozenset({"setup.cfg", "pyproject.toml"})
# A changed line that is pytest's configuration: its section header, or one of its options
# (``addopts``, ``-p``, plugins, what is collected). A line that merely names pytest (a
# dependency, isort's known_third_party list) is not: resetting the file for it would undo an
# honest change to the rest of it (pylint's gold patch for 4661 adds a dependency there).
_PYTEST_CONFIG_LINE = re.compile(
    r"\[(tool:)?pytest\]|\[tool\.pytest|(^|\s)-p\s|^\s*(addopts|(pytest_|required_)?plugins|testpaths|python_files"
    r"|python_classes|python_functions|norecursedirs|confcutdir|usefixtures|xfail_strict|filterwarnings|markers"
    r"|minversion|pythonpath)\s*=",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class SurfaceTouch:
    path: str
    action: str  # "reset" (back to the baseline) or "removed" (the diff added it)
    why: str  # "test file", "test config", "start-up hook", "test patch file", "task surface"


def _why(path: str, test_patch_paths: set[str]) -> str | None:
    name = posixpath.basename(path)
    if path in test_patch_paths:
        return "test patch file"
    if name in ("sitecustomize.py", "usercustomize.py") or name.endswith(".pth"):
        return "start-up hook"
    if name in ("conftest.py", "pytest.ini", ".pytest.ini", "tox.ini", "noxfile.py"):
        return "test config"
    if any(fnmatch.fnmatchcase(name, pat) for pat in SURFACE_NAMES):
        return "test file"
    if TEST_DIRS & set(path.split("/")[:-1]):
        return "test file"
    return None


def _changed_lines(diff: str) -> dict[str, list[str]]:
    """Per file (new path, else old), its added and removed lines."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            target = line[4:].strip()
            current = target[2:] if target.startswith(("a/", "b/")) else (None if target == "/dev/null" else target)
        elif line.startswith("--- "):
            continue
        elif current is not None and line[:1] in ("+", "-"):
            out.setdefault(current, []).append(line[1:])
    return out


def surface_touches(diff: str, *, test_patch: str | None, patterns: Sequence[str] | None = None) -> list[SurfaceTouch]:
    """The test-surface files ``diff`` touches, with what the grader does to each."""
    if not diff.strip():
        return []
    test_patch_paths = set(touched_paths(test_patch)) if test_patch else set()
    added = {f.new_path for f in parse_files(diff) if f.old_path is None and f.new_path}
    changed = _changed_lines(diff)
    touches: list[SurfaceTouch] = []
    for path in touched_paths(diff):
        if patterns is not None:
            why = "task surface" if any(fnmatch.fnmatchcase(path, p) for p in patterns) else None
            why = why or ("test patch file" if path in test_patch_paths else None)
        else:
            why = _why(path, test_patch_paths)
            if why is None and posixpath.basename(path) in CONFIG_FILES:
                if any(_PYTEST_CONFIG_LINE.search(ln) for ln in changed.get(path, [])):
                    why = "test config"
        if why is not None:
            touches.append(SurfaceTouch(path=path, action="removed" if path in added else "reset", why=why))
    return touches


def surface_flags(touches: Sequence[SurfaceTouch]) -> list[str]:
    """Named flags for the report: what kinds of surface the diff went for."""
    flags = set()
    for t in touches:
        flags.add("diff_touches_tests" if t.why in ("test file", "test patch file", "task surface") else
                  "diff_touches_test_config" if t.why == "test config" else "diff_adds_startup_hook")  # fmt: skip
    return sorted(flags)
