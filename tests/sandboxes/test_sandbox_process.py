"""HostProcess: a command's exit is seen at exit, even when a leftover process it
started still holds its output pipes (asyncio's Process.wait() alone would wait for
those pipes to close: a hang as long as the leftover lives)."""

from __future__ import annotations

import asyncio
import time

from farm.sandboxes.process import HostProcess


async def test_exit_is_seen_while_a_leftover_holds_the_pipes():
    proc = await HostProcess.spawn(
        ["bash", "-c", "sleep 60 & echo started"], env={"PATH": "/usr/bin:/bin"}, cwd=None,
        describe="leftover", max_output_bytes=1 << 16, kill_grace_s=5.0,
    )  # fmt: skip
    t0 = time.monotonic()
    result = await asyncio.wait_for(proc.wait(timeout=120), 30)
    assert result.exit_code == 0 and "started" in result.stdout
    assert time.monotonic() - t0 < 15, "waited for the leftover's pipes"
