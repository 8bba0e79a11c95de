"""The reducer's process keeps freed memory for reuse (farm.actors.reducer.steady_malloc),
set in the process rather than by environment variables (which cost every run a fresh
Ray worker for it). Checked by what a freed 16 MiB allocation does to the process's RSS,
in a child process of its own (the setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHILD = """
import sys
from farm.actors.reducer import steady_malloc

def anon_kb():
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith("RssAnon:"))

if sys.argv[1] == "steady":
    assert steady_malloc()
before = anon_kb()
block = b"x" * (16 << 20)  # malloc'd and written
held = anon_kb()
del block
print(held - before, held - anon_kb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc: Linux")
def test_freed_memory_stays_with_the_steady_setting_and_goes_back_without():
    def run(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
        grew, given_back = map(int, out.stdout.split())
        return grew, given_back

    grew, given_back = run("default")  # glibc: a 16 MiB block is its own mapping, unmapped when freed
    assert grew >= 15 << 10 and given_back >= 15 << 10, (grew, given_back)
    grew, given_back = run("steady")  # from the heap, which is not trimmed below 1 GiB free
    assert grew >= 15 << 10 and given_back < 1 << 10, (grew, given_back)
