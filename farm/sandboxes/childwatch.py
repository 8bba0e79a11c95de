"""How asyncio hears that a sandbox's command exited: from a pidfd on the event loop, not a thread.

Python 3.11's default child watcher (``ThreadedChildWatcher``) starts one thread per
subprocess, blocked in ``waitpid``, and wakes the loop through its self-pipe when the child
exits. A rollout runs a dozen commands (the workspace, the CLI, the diff's capture, the
grading steps): a dozen threads started and joined, and two loop wake-ups each, in the
process that also serves the model turns. Python 3.12 chose the pidfd watcher by default
(3.14 has no other): the loop itself polls a ``pidfd_open`` descriptor that becomes
readable when the child exits, and reaps it there.

``install()`` gives a 3.11 process the same: the watcher below does what 3.12's does, for
whichever loop starts the child (Ray runs an async actor's loop on a thread of its own, the
tests one loop per test). It replaces only asyncio's own default (a policy or watcher set
by someone else stays), and only where the kernel has ``pidfd_open`` (Linux 5.3+).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_decided = False


class PidfdChildWatcher(asyncio.AbstractChildWatcher):
    """3.12's ``asyncio.PidfdChildWatcher``: no state of its own, the running loop does the
    waiting (3.11's version is bound to one loop by ``attach_loop``)."""

    def __enter__(self) -> PidfdChildWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass

    def add_child_handler(self, pid: int, callback: Callable[..., Any], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop._add_reader(pidfd, self._do_wait, pid, pidfd, callback, args)  # type: ignore[attr-defined]

    def _do_wait(self, pid: int, pidfd: int, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        asyncio.get_running_loop()._remove_reader(pidfd)  # type: ignore[attr-defined]
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere (a waitpid(-1) of someone else's)
            returncode = 255
            log.warning("child process pid %d exit status already read: will report returncode 255", pid)
        else:
            returncode = os.waitstatus_to_exitcode(status)
        os.close(pidfd)
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # nothing kept: the reader goes with the child's exit


def install() -> None:
    """Watch this process's asyncio children by pidfd, once, where 3.11 would use a thread each."""
    global _decided
    if _decided:
        return
    _decided = True
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return  # 3.12+ chose pidfd itself (its watcher API is deprecated)
    policy = asyncio.get_event_loop_policy()
    if type(policy) is not asyncio.DefaultEventLoopPolicy:
        return  # someone's own policy (uvloop's, say) decides
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel before 5.3, or a seccomp filter that refuses it
        return
    current = policy.get_child_watcher()
    if type(current) is asyncio.ThreadedChildWatcher:  # asyncio's default, not one someone chose
        policy.set_child_watcher(PidfdChildWatcher())
