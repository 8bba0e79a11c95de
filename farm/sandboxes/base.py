"""The Sandbox protocol: the one interface every sandbox backend implements.

All calls are async. ``exec`` never raises on a non-zero exit code (that is a result);
it raises ``SandboxTimeout`` when the command outlived its timeout (its whole process
tree has been killed by then), ``SandboxClosed`` after ``close()``, and
``SandboxError`` when the backend itself failed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from farm.sandboxes.views import SnapshotView


class ExecResult(BaseModel):
    """Outcome of one finished command."""

    model_config = ConfigDict(frozen=True)

    exit_code: int  # negative: killed by that signal (e.g. -9)
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    truncated: bool = False  # output exceeded the capture cap: head + tail kept, middle dropped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class SandboxSpec(BaseModel):
    """What to create. Backends ignore fields that do not apply to them."""

    model_config = ConfigDict(extra="forbid")

    labels: dict[str, str] = Field(default_factory=dict, description="run_id, rollout_id, task_id, ...")
    image: str | None = Field(default=None, description="E2B template / image name")
    env: dict[str, str] = Field(default_factory=dict, description="env for every command")
    timeout_s: float = Field(default=3600.0, description="sandbox lifetime budget (local: enforced, a breach)")
    ro_binds: list[str] = Field(
        default_factory=list,
        description="host paths a local sandbox shows read-only at the same path (e.g. the harness CLI's "
        "package); E2B ignores it",
    )
    host_programs: list[str] = Field(
        default_factory=list,
        description="host executables the sandbox runs (the harness CLI): a local sandbox whose root is a "
        "container image runs relinked copies of them, on their own loader and libraries "
        "(farm.sandboxes.hostrt); elsewhere they are seen through ro_binds; E2B ignores it",
    )
    view: SnapshotView | None = Field(
        default=None,
        description="start from a frozen environment: its tree at view.mount, as a private copy-on-write view "
        "(local), or the environment's template (E2B: see farm.envs)",
    )


@runtime_checkable
class BackgroundProcess(Protocol):
    """A process started with ``Sandbox.start``."""

    async def wait(self, timeout: float | None = None) -> ExecResult:
        """Wait for exit. Raises SandboxTimeout (after killing the tree) on timeout."""

    async def kill(self) -> None:
        """Kill the whole process tree. Idempotent."""


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run a workspace, an agent CLI and tests."""

    id: str
    labels: dict[str, str]
    root: str  # absolute path of the sandbox's writable root, as seen by its commands
    home: str  # $HOME of its commands (inside root)
    tmp: str  # its commands' TMPDIR: private to the sandbox, kept across its commands, the same path in every sandbox
    view: SnapshotView | None  # the environment snapshot (farm.envs) it starts from (None: an empty root)
    view_ready_s: float  # seconds its view took to be ready (mounted, copied); 0 when none or nothing to wait for

    async def exec(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = 60.0,
        user: str | None = None,
    ) -> ExecResult:
        """Run to completion. A str runs under ``bash -c``; a list is an argv.

        ``cwd`` defaults to ``root``; ``env`` is added to the sandbox's env (no host env
        leaks in); ``timeout=None`` waits forever; stdin is always /dev/null.
        """

    async def start(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> BackgroundProcess:
        """Start in the background (no timeout: the caller waits with one)."""

    async def write_file(self, path: str, data: str | bytes) -> None:
        """Write ``path``, creating missing parent directories (the grader relies on it)."""

    async def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """``write_file`` for each (path, data), in order, as one call: a local sandbox writes
        them in one worker-thread job (each job costs farm's process a hand-off and wake-ups)."""

    async def read_file(self, path: str) -> bytes: ...

    async def read_tail(self, path: str, n: int) -> bytes:
        """The last ``n`` bytes of ``path`` (all of it when shorter): a log's end, without
        reading what came before (local: the host file; E2B: ``tail -c`` inside)."""

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None: ...

    async def upload_tarball(self, local_tar: str, remote_dir: str) -> None: ...

    async def isolate_network(self) -> None:
        """One-way latch: from now on every command reaches only its own loopback (plus
        ``forward_port``'s ports). Before it, commands use the backend's setup network
        (local: ``sandbox.local.setup_network``). E2B: a no-op (off the cluster network)."""

    async def forward_port(self, port: int) -> str | None:
        """From now on, inside the sandbox, TCP to 127.0.0.1:``port`` reaches a unix socket
        whose HOST path this returns (the caller listens there). Idempotent per port.
        None when the sandbox reaches the host by URL (E2B, or a local sandbox on the
        host network)."""

    @property
    def network_policy(self) -> dict[str, str]:
        """Which network applied (``setup``, ``agent``, ``forwarded_ports``), for the record."""

    @property
    def limits_policy(self) -> dict[str, str]:
        """Which resource limits applied and what enforced them, for the record ({} where the
        backend's own limits apply: E2B)."""

    @property
    def breaches(self) -> list[str]:
        """The limits this sandbox's processes ran into, as precise reasons ([] if none)."""

    def busy_processes(self) -> int | None:
        """How many of its processes do work of their own now (a tool the agent runs); None
        where the backend cannot tell (E2B): then no CLI is found idle. Blocking: call it in a thread."""

    async def close(self) -> None:
        """Kill everything and release the sandbox. Idempotent."""

    def add_close_callback(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once when the sandbox is closed."""

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class ClosingContext:
    """Mixin for backends: ``async with`` (closes on exit) and close callbacks."""

    _close_callbacks: list[Callable[[], None]]

    async def __aenter__(self):  # noqa: ANN204 - returns the concrete sandbox type
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()  # type: ignore[attr-defined]

    def add_close_callback(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once when the sandbox is closed (e.g. release a limiter slot)."""
        self.__dict__.setdefault("_close_callbacks", []).append(fn)

    def _run_close_callbacks(self) -> None:
        callbacks, self._close_callbacks = self.__dict__.get("_close_callbacks", []), []
        for fn in callbacks:
            fn()
