"""Can the sandbox reach the gateway? Asked from inside the sandbox, before and during a run.

A CLI whose endpoint is down does not fail fast: Claude Code retries ~10 times over
minutes, Codex waits "for network" forever, OpenCode retries silently. So farm asks
the question itself: any HTTP answer counts (404 and 401 mean the gateway is there). An
http URL (a local sandbox's relayed port) is asked by bash alone, a ``HEAD`` over
``/dev/tcp``: ~2 ms of CPU against curl's ~11 (its libraries' start), once a rollout
before the CLI and again while it is quiet; an https URL (E2B's gateway) by ``curl``.
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
    if parts.scheme == "http":
        # a connect alone is not an answer: a relay in the jail accepts even when the gateway
        # behind it is gone (and then closes: no status line)
        ask = (
            f"{{ exec 3<>/dev/tcp/{host}/{port}; }} 2>/dev/null || {{ echo {q(f'cannot connect to {host}:{port}')} >&2; exit 7; }}; "
            # bash writes the request a line at a time: a peer that closed before its end resets
            # the connection, and the next write must fail with a message, not kill bash (SIGPIPE)
            f"trap '' PIPE; printf 'HEAD / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n' {q(f'{host}:{port}')} >&3 2>/dev/null "
            f"|| {{ echo {q(f'no HTTP answer from {host}:{port} (the connection closed)')} >&2; exit 8; }}; "
            f"IFS= read -r line <&3 || {{ echo {q(f'no HTTP answer from {host}:{port}')} >&2; exit 8; }}; "
            f'case "$line" in HTTP/*) exit 0;; esac; '
            f"echo {q(f'not an HTTP answer from {host}:{port}: ')}\"${{line:0:100}}\" >&2; exit 9"
        )
        late = f"echo {q(f'no answer from {host}:{port} within {t} s')} >&2"
        return f"timeout {t} bash -c {q(ask)}; r=$?; [ $r != 124 ] || {late}; exit $r"
    no_curl = f"echo {q('no curl in the sandbox: cannot probe ' + parts.scheme + ' URLs')} >&2; exit 0"
    return (
        "if command -v curl >/dev/null 2>&1; then "
        f"exec curl -sS -o /dev/null -I --max-time {t} {q(url.rstrip('/') + '/')}; "
        f"else {no_curl}; fi"
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
