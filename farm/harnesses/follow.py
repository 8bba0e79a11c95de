"""Follow a CLI's stdout file inside its sandbox while it runs: complete lines, in order,
each once (the live ``agent_output`` events of ``farm.single``).

Polls with ``tail -c +OFFSET`` (works on every sandbox backend); a partial last line
waits for its newline. Reading is best effort: a failed read is tried again next tick.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from farm.errors import SandboxError
from farm.sandboxes.base import Sandbox

log = logging.getLogger(__name__)

MAX_LINE_CHARS = 4000  # a stream-json line can hold a whole file; an event needs its head


async def follow_lines(sandbox: Sandbox, path: str, on_line: Callable[[str], None], stop: asyncio.Event, *,
                       interval_s: float = 1.0) -> None:
    """Call ``on_line`` for each complete line appended to ``path`` until ``stop`` is set
    (then reads once more: the lines written just before the CLI ended are not lost)."""
    offset, pending = 0, b""

    async def read() -> None:
        nonlocal offset, pending
        try:
            res = await sandbox.exec(["tail", "-c", f"+{offset + 1}", path], timeout=30)
        except SandboxError as exc:
            log.debug("following %s: %s", path, exc)
            return
        if res.exit_code != 0 or not res.stdout:
            return
        data = res.stdout.encode()
        offset += len(data)
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", errors="replace")
            if text.strip():
                on_line(text[:MAX_LINE_CHARS])

    while not stop.is_set():
        await read()
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass
    await read()
    if pending.strip():
        on_line(pending.decode("utf-8", errors="replace")[:MAX_LINE_CHARS])
