"""Can the sandbox reach the gateway? Asked from inside the sandbox, before and during a run.

A CLI whose endpoint is down does not fail fast: Claude Code retries ~10 times over
minutes, Codex waits "for network" forever, OpenCode retries silently. So farm asks
the question itself: ``curl`` (any HTTP answer counts: 404 and 401 mean the gateway is
there) and, where curl is missing, a bash ``/dev/tcp`` connect for http URLs.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from urllib.parse import urlsplit

from farm.errors import SandboxError
from farm.sandboxes.base import Sandbox


def probe_script(url: str, timeout_s: float) -> str:
    """A bash script exiting 0 when ``url`` answers HTTP, non-zero (with a message) otherwise."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    t = max(1, int(round(timeout_s)))
    q = shlex.quote
    tcp = (
        f"exec timeout {t} bash -c {q(f'exec 3<>/dev/tcp/{host}/{port}')} 2>/dev/null "
        f"|| {{ echo {q(f'cannot connect to {host}:{port}')} >&2; exit 7; }}"
    )
    no_probe = f"echo {q('no curl in the sandbox: cannot probe ' + parts.scheme + ' URLs')} >&2; exit 0"
    fallback = tcp if parts.scheme == "http" else no_probe
    return (
        "if command -v curl >/dev/null 2>&1; then "
        f"exec curl -sS -o /dev/null -I --max-time {t} {q(url.rstrip('/') + '/')}; "
        f"else {fallback}; fi"
    )


async def probe_gateway(sandbox: Sandbox, url: str, *, timeout_s: float) -> str | None:
    """None when the gateway answers from inside ``sandbox``; else why not.

    Retries a refused connection until ``timeout_s`` (a gateway that is still starting gets
    a moment); an attempt that connected waits for the answer until ``timeout_s`` too: on a
    CPU-starved node a late answer is still an answer, and cutting the attempt short (3 s
    each, before) only started another jail.
    """
    deadline = time.monotonic() + timeout_s
    reason = "no attempt"
    while True:
        left = deadline - time.monotonic()
        per_try = max(1.0, left)
        try:
            res = await sandbox.exec(["bash", "-c", probe_script(url, per_try)], timeout=per_try + 10)
        except SandboxError as exc:
            reason = f"probe failed: {exc}"
        else:
            if res.exit_code == 0:
                return None
            reason = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit {res.exit_code}"]
            reason = reason[0][:300]
        if time.monotonic() + 0.5 >= deadline:
            return reason
        await asyncio.sleep(0.5)
