"""Host processes for the local backend: capped output capture and whole-tree kill.

Every process is started in its own session (so its process group id is its pid);
killing a process means SIGKILL to that whole process group. Under bubblewrap the
command also lives in its own PID namespace, so once the namespace's init dies the
kernel kills everything else in it, including processes that left the group.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence

from farm.errors import SandboxError, SandboxTimeout
from farm.sandboxes import childwatch
from farm.sandboxes.base import ExecResult

_CHUNK = 64 * 1024
_DRAIN_GRACE_S = 2.0


class CappedBuffer:
    """Keeps the first and last ``cap // 2`` bytes of a stream; counts the rest."""

    def __init__(self, cap: int) -> None:
        self._head_cap = cap // 2
        self._tail_cap = cap - self._head_cap
        self._head = bytearray()
        self._tail: deque[bytes] = deque()
        self._tail_len = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self._tail.append(chunk)
        self._tail_len += len(chunk)
        while self._tail and self._tail_len - len(self._tail[0]) >= self._tail_cap:
            self._tail_len -= len(self._tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > self._head_cap + self._tail_cap

    def getvalue(self) -> bytes:
        tail = b"".join(self._tail)
        if not self.truncated:
            return bytes(self._head) + tail
        dropped = self.total - len(self._head) - self._tail_cap
        marker = f"\n[... {dropped} bytes truncated ...]\n".encode()
        return bytes(self._head) + marker + tail[-self._tail_cap :]

    def text(self) -> str:
        return self.getvalue().decode("utf-8", errors="replace")


async def _drain(stream: asyncio.StreamReader | None, buf: CappedBuffer) -> None:
    if stream is None:
        return
    while chunk := await stream.read(_CHUNK):
        buf.feed(chunk)


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        pass
    return [p for p, fields in _proc_stats() if len(fields) > 1 and fields[1] == str(pid)]


def _proc_stats() -> Iterator[tuple[int, list[str]]]:
    """(pid, fields after the command name) of every live process, from /proc/*/stat."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                yield int(name), fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (signal 0: the kernel's own
    lookup, O(1); a scan of /proc cost ~3-15 ms per command on a busy node)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal is still a member
        return True
    return True


def _killpg_members(pgid: int) -> None:
    """Kill what is left of a group whose leader is already reaped. The members hold
    the group id, so it cannot have been reused; an empty group is left alone."""
    if group_alive(pgid):
        _killpg(pgid)


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, and a future set when the child exits (the pipes may
    stay open: a leftover that inherited them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_CHUNK, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class HostProcess:
    """One started command: captured output, wait with timeout, kill of the whole tree.

    Implements the ``BackgroundProcess`` protocol.
    """

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        exited: asyncio.Future[None],
        *,
        describe: str,
        max_output_bytes: int,
        kill_grace_s: float,
        on_exit: Callable[[HostProcess], None] | None = None,
        jailed: bool = False,
    ) -> None:
        self._proc = proc
        self._exit = exited
        self._jailed = jailed
        self._describe = describe
        self._kill_grace_s = kill_grace_s
        self._on_exit = on_exit
        self._t0 = time.monotonic()
        self._out = CappedBuffer(max_output_bytes)
        self._err = CappedBuffer(max_output_bytes)
        self._readers = [
            asyncio.create_task(_drain(proc.stdout, self._out)),
            asyncio.create_task(_drain(proc.stderr, self._err)),
        ]
        self._result: ExecResult | None = None
        self._lock = asyncio.Lock()

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        describe: str,
        max_output_bytes: int,
        kill_grace_s: float,
        on_exit: Callable[[HostProcess], None] | None = None,
        jailed: bool = False,
        pass_fds: Sequence[int] = (),
    ) -> HostProcess:
        loop = asyncio.get_running_loop()
        childwatch.install()  # its exit heard on the loop (a pidfd), not by a thread per command
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(loop),
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {describe!r}: {exc}") from exc
        return cls(
            asyncio.subprocess.Process(transport, protocol, loop),
            protocol.exited,
            describe=describe,
            max_output_bytes=max_output_bytes,
            kill_grace_s=kill_grace_s,
            on_exit=on_exit,
            jailed=jailed,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def describe(self) -> str:
        """The command, as errors name it (cut to 200 characters)."""
        return self._describe

    @property
    def running(self) -> bool:
        return self._proc.returncode is None

    async def _exited(self) -> None:
        """The child's exit. asyncio's ``Process.wait()`` also waits until its pipes close,
        which a leftover process that inherited them can put off forever; the protocol
        hears of the exit itself (``_finish`` then drains what the pipes hold for a
        bounded time and kills leftovers). No polling: a running CLI costs no wake-ups."""
        await asyncio.shield(self._exit)

    async def wait(self, timeout: float | None = None) -> ExecResult:
        """Wait for exit and collect output; on timeout kill the tree and raise SandboxTimeout."""
        try:
            await asyncio.wait_for(self._exited(), timeout)
        except TimeoutError:
            await self.kill()
            raise SandboxTimeout(
                f"command {self._describe!r} exceeded its timeout of {timeout:g} s; its process tree was killed"
            ) from None
        return await self._finish()

    async def kill(self) -> None:
        """SIGKILL the whole process group and reap it. Idempotent."""
        if self._jailed and self._proc.returncode is None:
            # Kill bwrap's namespace init first: the kernel then kills everything in the
            # namespace and the outer bwrap reaps it and exits. Killing both at once would
            # orphan the init's zombie to PID 1 (which in containers may never reap it).
            kids = child_pids(self._proc.pid)
            for kid in kids:
                _kill(kid)
            if kids:
                try:
                    await asyncio.wait_for(self._exited(), _DRAIN_GRACE_S)
                except TimeoutError:
                    pass
        if self._proc.returncode is None:
            _killpg(self._proc.pid)
        else:
            _killpg_members(self._proc.pid)
        try:
            await asyncio.wait_for(self._exited(), self._kill_grace_s)
        except TimeoutError:
            raise SandboxError(
                f"command {self._describe!r} (pid {self._proc.pid}) did not exit {self._kill_grace_s:g} s after SIGKILL"
            ) from None
        await self._finish()

    async def _finish(self) -> ExecResult:
        async with self._lock:
            if self._result is not None:
                return self._result
            # Leftover members of the group (only possible without a PID namespace)
            # could hold the pipes open: give them a moment, then kill the group.
            done, pending = await asyncio.wait(self._readers, timeout=_DRAIN_GRACE_S)
            _killpg_members(self._proc.pid)
            if pending:
                done2, pending = await asyncio.wait(pending, timeout=_DRAIN_GRACE_S)
                for task in pending:
                    task.cancel()
            for task in self._readers:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise SandboxError(f"reading output of {self._describe!r} failed: {task.exception()}")
            code = self._proc.returncode
            assert code is not None
            self._result = ExecResult(
                exit_code=code,
                stdout=self._out.text(),
                stderr=self._err.text(),
                duration_s=time.monotonic() - self._t0,
                truncated=self._out.truncated or self._err.truncated,
            )
            if self._on_exit is not None:
                self._on_exit(self)
            return self._result
