"""Can the task's environment run its tests? A broken environment is infrastructure.

A run that reached none of the tests that decide the reward, for a cause in the
environment rather than in the code, is no grade at all: not a reward 0 to train on,
not a reward hack. :func:`diagnose` names such a cause from what the run printed and
from the probe's collection errors:

- the test command's program is missing (exit 126/127: no interpreter, no venv);
- pytest is not installed;
- a module the tests import is not installed and is not the repository's own (a
  conftest importing a package the environment lacks: pytest's exit 4);
- pytest refuses its command line or configuration (an option of a plugin the
  environment lacks, a test path that is not there).

A missing module the repository itself should provide is the code's business (the
fix may add it), as is every other failure: a syntax error, a crash, ``os._exit``.
When the environment's setup left packages out (a conda environment file's packages PyPI
lacks: ``SetupReport.left_out``), a failure on a missing module names them
(``left_out_note``), both for a broken environment and for tests that failed.
Because the diff can cause the same symptoms (it may import a package the environment
lacks), the grader confirms a cause found with a diff applied by grading the empty
patch in a fresh sandbox: the same failure without the diff is the environment's
(``GradeStatus.ENV_BROKEN``), one only the diff brings is the policy's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from farm.grading.hacks import added_lines

_MISSING_MODULE = re.compile(r"No module named '?([A-Za-z_][\w.]*)'?")
_PYTEST_REFUSED = re.compile(
    r"^(?:ERROR: usage: .*|.*: error: unrecognized arguments: .*|ERROR: file or directory not found: .*"
    r"|ERROR: found no collectors for .*|ERROR: Unknown config option: .*)$",
    re.M,
)
_NOT_FOUND = re.compile(r"^.*(?:command not found|: not found|No such file or directory)\s*$", re.M)
PROBE_FAILED = re.compile(r"Error importing plugin \"?farm_probe\"?")


def missing_modules(text: str) -> list[str]:
    """Top-level names of the modules an ImportError in ``text`` says are missing."""
    return sorted({m.group(1).split(".")[0] for m in _MISSING_MODULE.finditer(text)})


# a host name failing to resolve; or a library that downloads its tests' data files and warns
# instead of raising when it cannot (pydicom 2's data manager: the test then reads None)
_OFFLINE = re.compile(r"Temporary failure in name resolution|Name or service not known|Failed to resolve"
                      r"|No address associated with hostname|Network is unreachable|nodename nor servname provided"
                      r"|getaddrinfo failed|download failures? occurred while attempting to retrieve [\w.-]+")  # fmt: skip
_HOST = re.compile(r"\bhttps?://([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,})")


# the flag of a grading that left out PASS_TO_PASS tests needing the network (``grader._offline_p2p``)
OFFLINE_P2P = "p2p_needs_network"


def tried_the_network(text: str) -> bool:
    """Does a run's output show a host name failing to resolve (a sandbox has no network)?"""
    return _OFFLINE.search(text) is not None


def network_note(text: str) -> str:
    """When a run's output shows its tests failing to reach hosts (names that do not resolve: a
    sandbox has no network), the sentence that says so, with the hosts; else ''."""
    found = _OFFLINE.search(text)
    if found is None:
        return ""
    lines = [ln for ln in text.splitlines() if _OFFLINE.search(ln) or "[broken]" in ln or "ConnectionError" in ln]
    hosts = sorted({h for ln in lines for h in _HOST.findall(ln) if h != "localhost"})
    where = f" ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})" if hosts else ""
    return (f"; its tests reach hosts on the internet{where} ({found.group(0)}): a grading sandbox has no network, "
            "SWE-bench's harness ran them online")


# numpy's removed names: the aliases of builtins went in 1.24 (np.float, np.int, ...), more in 2.0
# (np.float_, np.NaN, ...). Code written before then fails on them in a later numpy.
_NUMPY_GONE = re.compile(r"AttributeError: module 'numpy' has no attribute '(\w+)'")


def removed_numpy_note(text: str) -> str:
    """When a run's output shows the code using a name numpy has since removed (``np.float``),
    the sentence that says so and what to do; else ''."""
    names = sorted(set(_NUMPY_GONE.findall(text)))
    if not names:
        return ""
    return (f"; its code uses {', '.join('np.' + n for n in names)}, which the environment's numpy no longer has "
            "(the builtin aliases went in numpy 1.24, more names in 2.0): the row was made with an earlier numpy; "
            "pin one for this version in a recipe file (tasks.recipes)")


def left_out_note(text: str, left_out: Sequence[str]) -> str:
    """When a run failed on missing modules and its environment's setup left packages out
    (conda-only ones: ``SetupReport.left_out``), the sentence that says so; else ''."""
    missing = missing_modules(text)
    if not left_out or not missing:
        return ""
    return (f"; it failed on missing module(s) {', '.join(missing)}, and the environment's setup left out "
            f"{'; '.join(left_out)}")


def diagnose(*, exit_code: int | None, text: str, repo_names: Iterable[str] = ()) -> str | None:
    """The environment's cause for a run that reached none of its tests (``text``: its
    output and the probe's collection errors), or None when nothing in the environment
    explains it. ``repo_names``: the workspace's top-level module names (their own
    absence is the code's business)."""
    if exit_code == 0:
        return None
    if exit_code in (126, 127) and (line := _NOT_FOUND.search(text)) is not None:
        return f"the test command's program is missing (exit {exit_code}): {line.group(0).strip()[:200]}"
    own = set(repo_names)
    lacking = [m for m in missing_modules(text) if m not in own]
    if "pytest" in lacking:
        return "pytest is not installed in the task's environment"
    if lacking:
        return f"the environment lacks module(s) the tests import: {', '.join(lacking)}"
    if (line := _PYTEST_REFUSED.search(text)) is not None:
        return f"pytest refuses the test command or configuration: {line.group(0).strip()[:200]}"
    return None


def diff_brings(diff: str, cause: str) -> bool:
    """Without a baseline run: does the diff itself import a module ``cause`` names?"""
    names = re.findall(r"[A-Za-z_][\w]*", cause.partition(": ")[2])
    for _, line in added_lines(diff):
        stripped = line.strip()
        if stripped.startswith(("import ", "from ")) and any(re.search(rf"\b{re.escape(n)}\b", stripped) for n in names):
            return True
    return False
