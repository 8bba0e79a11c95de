"""How a run is stopped: SIGTERM (``ray job stop``) and SIGINT (Ctrl-C) both start a
graceful stop (in-flight rollouts are interrupted, recorded nowhere, and run again by
the next invocation); a second signal during the stop cuts the drain short; signals
during the final cleanup (actors, reducer flush, summary) are noted and ignored.

Installed by the driver *after* ``ray.init``: Ray installs its own SIGTERM handler
there, which would otherwise replace farm's and abort the process (exit 134).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


_state = {"cleanup": False}


def _raise_interrupt(signum: int, frame: object) -> None:
    if _state["cleanup"]:  # the stop is already being finished: never leave it half done
        print(f"farm: {signal.Signals(signum).name} during cleanup: finishing the stop", file=sys.stderr)
        return
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


@contextlib.contextmanager
def cleanup_phase() -> Iterator[None]:
    """While inside, stop signals are noted, not raised: closing actors, flushing the
    reducer and writing the summary always finish (each step is bounded in time)."""
    before, _state["cleanup"] = _state["cleanup"], True
    try:
        yield
    finally:
        _state["cleanup"] = before


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise KeyboardInterrupt in the main thread while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
