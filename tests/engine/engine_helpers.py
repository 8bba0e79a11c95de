"""Engine test helpers: the scripted worker and router processes a test started."""

from __future__ import annotations

import os
from pathlib import Path

def live_pids(pids) -> set[int]:
    """Pids still running (zombies count as gone)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def farm_engine_pids(marker: str = "") -> set[int]:
    """Running scripted worker / router processes (whose command line contains ``marker``)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if (b"farm engine serve" in cmd or b"sglang_router.launch_router" in cmd) and marker.encode() in cmd:
            out.add(int(entry))
    return live_pids(out)
