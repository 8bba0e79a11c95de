"""E2BSandbox: the Sandbox protocol over the ``e2b`` SDK's ``AsyncSandbox``.

- Commands start in the background with the SDK's connection timeout off
  (``timeout=0``); farm enforces the budget itself and kills the command on expiry,
  so long agents are never cut by the SDK's 60 s default.
- A non-zero exit (``CommandExitException``) is an ``ExecResult``, not an error.
- Only idempotent calls are retried (create with an idempotency key, file reads and
  writes, list, kill), with exponential backoff, and only on transient errors.
- SDK errors map to farm's: ``AuthenticationException`` (NOT a ``SandboxException``)
  -> ``SandboxAuthError``; missing files -> ``SandboxFileNotFound``; the rest ->
  ``SandboxError`` with the SDK's message.
- The API key is an argument; the SDK's own fallback to ``E2B_API_KEY`` is never used.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import tarfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import httpx
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxUnreachableException,
    ServiceBusyException,
    TimeoutException,
)

from farm.errors import SandboxAuthError, SandboxClosed, SandboxError, SandboxFileNotFound, SandboxTimeout
from farm.sandboxes.base import ClosingContext, ExecResult, SandboxSpec
from farm.sandboxes.config import E2BSandboxConfig
from farm.sandboxes.process import CappedBuffer

T = TypeVar("T")
_UPLOAD_TMP = "/tmp"


# --- policies (pure) -----------------------------------------------------------
def is_retryable(exc: BaseException) -> bool:
    """Transient failures worth retrying for an idempotent call."""
    if isinstance(exc, SandboxNotRunningException):
        return False  # the sandbox is gone: retrying cannot help
    return isinstance(
        exc,
        RateLimitException | ServiceBusyException | SandboxUnreachableException | TimeoutException | httpx.TransportError,
    )


def retry_delays(retries: int, base_s: float, cap_s: float = 30.0) -> list[float]:
    """Backoff before each retry: base, 2*base, 4*base, ... capped."""
    return [min(cap_s, base_s * 2**i) for i in range(retries)]


def map_error(exc: BaseException, what: str) -> SandboxError:
    """An SDK exception as the farm error a caller can act on."""
    if isinstance(exc, AuthenticationException):
        return SandboxAuthError(
            f"E2B rejected the API key during {what}: check E2B_API_KEY ({type(exc).__name__}: {exc})"
        )
    if isinstance(exc, FileNotFoundException):
        return SandboxFileNotFound(f"{what}: {exc}")
    if isinstance(exc, SandboxNotRunningException | NotFoundException):
        return SandboxError(f"{what}: the E2B sandbox is gone (killed or past its lifetime): {exc}")
    if isinstance(exc, RateLimitException | ServiceBusyException):
        return SandboxError(f"{what}: E2B is rate limiting or busy ({type(exc).__name__}): {exc}")
    if isinstance(exc, SandboxException | httpx.HTTPError):
        return SandboxError(f"{what} failed ({type(exc).__name__}): {exc}")
    return SandboxError(f"{what} failed unexpectedly ({type(exc).__name__}): {exc}")


async def call_with_retries(
    fn: Callable[[], Awaitable[T]],
    *,
    what: str,
    retries: int,
    backoff_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Run an IDEMPOTENT call, retrying transient failures; SDK errors come out mapped."""
    delays = retry_delays(retries, backoff_s)
    for attempt in range(len(delays) + 1):
        try:
            return await fn()
        except SandboxError:
            raise
        except (SandboxException, AuthenticationException, ServiceBusyException, httpx.HTTPError) as exc:
            if attempt < len(delays) and is_retryable(exc):
                await sleep(delays[attempt])
                continue
            raise map_error(exc, what) from exc
    raise AssertionError("unreachable")  # pragma: no cover


# --- processes -------------------------------------------------------------------
class E2BProcess:
    """A command started in an E2B sandbox (implements ``BackgroundProcess``)."""

    def __init__(self, describe: str, max_output_bytes: int) -> None:
        self._describe = describe
        self.out = CappedBuffer(max_output_bytes)
        self.err = CappedBuffer(max_output_bytes)
        self._handle: Any = None
        self._t0 = time.monotonic()
        self._result: ExecResult | None = None

    def attach(self, handle: Any) -> None:
        self._handle = handle

    def _as_result(self, exit_code: int) -> ExecResult:
        return ExecResult(
            exit_code=exit_code,
            stdout=self.out.text(),
            stderr=self.err.text(),
            duration_s=time.monotonic() - self._t0,
            truncated=self.out.truncated or self.err.truncated,
        )

    async def wait(self, timeout: float | None = None) -> ExecResult:
        if self._result is not None:
            return self._result
        try:
            done = await asyncio.wait_for(self._handle.wait(), timeout)
            self._result = self._as_result(int(done.exit_code))
        except CommandExitException as exc:
            self._result = self._as_result(int(exc.exit_code))
        except TimeoutError:
            await self.kill()
            raise SandboxTimeout(
                f"command {self._describe!r} exceeded its timeout of {timeout:g} s; it was killed"
            ) from None
        except (SandboxException, AuthenticationException, ServiceBusyException, httpx.HTTPError) as exc:
            raise map_error(exc, f"command {self._describe!r}") from exc
        return self._result

    async def kill(self) -> None:
        """SIGKILL the command (envd kills it); idempotent, errors on a gone sandbox ignored."""
        if self._result is not None or self._handle is None:
            return
        try:
            await self._handle.kill()
        except (SandboxException, httpx.HTTPError):
            pass  # already exited, or the sandbox is gone (which kills it too)
        try:
            await self._handle.disconnect()
        except (SandboxException, httpx.HTTPError):
            pass


# --- the sandbox ---------------------------------------------------------------
class E2BSandbox(ClosingContext):
    """An E2B sandbox. Build with ``await E2BSandbox.create(cfg, spec, api_key=...)``;
    tests inject a fake SDK sandbox object through the constructor."""

    def __init__(
        self,
        sdk_sandbox: Any,
        cfg: E2BSandboxConfig,
        spec: SandboxSpec,
        *,
        max_output_bytes: int = 8 * 1024**2,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._sdk = sdk_sandbox
        self._cfg = cfg
        self._max_output = max_output_bytes
        self._sleep = sleep
        self.id = str(sdk_sandbox.sandbox_id)
        self.labels = dict(spec.labels)
        self.view = spec.view  # the environment template it was created from (farm.envs), if any
        self.view_ready_s = 0.0  # the template is the VM's disk: nothing to wait for
        self.root = cfg.root
        self.home = "/root" if cfg.user == "root" else f"/home/{cfg.user}"
        self.tmp = _UPLOAD_TMP  # the VM's own /tmp
        self._procs: set[E2BProcess] = set()
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None

    @classmethod
    async def create(
        cls,
        cfg: E2BSandboxConfig,
        spec: SandboxSpec,
        *,
        api_key: str,
        max_output_bytes: int = 8 * 1024**2,
        sdk: Any = AsyncSandbox,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> E2BSandbox:
        """Create (retried safely: the same idempotency key is sent on every attempt)."""
        key = str(uuid.uuid4())
        opts: dict[str, Any] = {"api_key": api_key, "request_timeout": cfg.request_timeout_s}
        if cfg.domain:
            opts["domain"] = cfg.domain

        view = spec.view
        template = view.template if view is not None and view.template else spec.image or cfg.template

        async def create_once() -> Any:
            return await sdk.create(
                template=template,
                timeout=int(spec.timeout_s),
                metadata=dict(spec.labels),
                envs=dict(spec.env),
                idempotency_key=key,
                **opts,
            )

        sdk_sb = await call_with_retries(
            create_once, what="E2B sandbox create", retries=cfg.retries, backoff_s=cfg.backoff_s, sleep=sleep
        )
        return cls(sdk_sb, cfg, spec, max_output_bytes=max_output_bytes, sleep=sleep)

    async def _retrying(self, fn: Callable[[], Awaitable[T]], what: str) -> T:
        return await call_with_retries(
            fn, what=f"{what} (sandbox {self.id})", retries=self._cfg.retries, backoff_s=self._cfg.backoff_s, sleep=self._sleep
        )

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosed(f"sandbox {self.id} is closed")

    def _path(self, path: str) -> str:
        return path if path.startswith("/") else f"{self.root.rstrip('/')}/{path}"

    # --- commands ------------------------------------------------------------
    async def start(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> E2BProcess:
        """Start in the background. Not retried: starting a command is not idempotent."""
        self._check_open()
        text = cmd if isinstance(cmd, str) else shlex.join(cmd)
        proc = E2BProcess(text if len(text) <= 200 else text[:197] + "...", self._max_output)
        try:
            handle = await self._sdk.commands.run(
                text,
                background=True,
                envs=env or None,
                user=user or self._cfg.user,
                cwd=self._path(cwd) if cwd else self.root,
                on_stdout=lambda s: proc.out.feed(s.encode()),
                on_stderr=lambda s: proc.err.feed(s.encode()),
                timeout=0,
                request_timeout=self._cfg.request_timeout_s,
                retain_output=False,
            )
        except (SandboxException, AuthenticationException, ServiceBusyException, httpx.HTTPError) as exc:
            raise map_error(exc, f"starting {text!r} in sandbox {self.id}") from exc
        proc.attach(handle)
        self._procs.add(proc)
        return proc

    async def exec(
        self,
        cmd: str | list[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = 60.0,
        user: str | None = None,
    ) -> ExecResult:
        proc = await self.start(cmd, cwd=cwd, env=env, user=user)
        try:
            return await proc.wait(timeout)
        finally:
            await proc.kill()  # no-op once it has a result; kills it if we were cancelled
            self._procs.discard(proc)

    # --- files ---------------------------------------------------------------
    async def write_file(self, path: str, data: str | bytes) -> None:
        self._check_open()
        target = self._path(path)
        await self._retrying(lambda: self._sdk.files.write(target, data, user=self._cfg.user), f"write {target}")

    async def write_files(self, files: Mapping[str, str | bytes]) -> None:
        for path, data in files.items():  # one API call each, as write_file
            await self.write_file(path, data)

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        target = self._path(path)
        data = await self._retrying(
            lambda: self._sdk.files.read(target, format="bytes", user=self._cfg.user), f"read {target}"
        )
        return bytes(data)

    async def read_tail(self, path: str, n: int) -> bytes:
        target = self._path(path)
        res = await self.exec(["tail", "-c", str(int(n)), target], timeout=30)
        if res.exit_code != 0:
            if "No such file" in res.stderr:
                raise SandboxFileNotFound(f"{path}: no such file in sandbox {self.id}")
            raise SandboxError(f"read_tail {target}: {res.stderr.strip()[:200]}")
        return res.stdout.encode("utf-8", errors="surrogateescape")

    async def upload_tarball(self, local_tar: str, remote_dir: str) -> None:
        self._check_open()
        with open(local_tar, "rb") as fh:
            payload = fh.read()
        await self._extract(payload, self._path(remote_dir))

    async def upload_dir(self, local_dir: str, remote_dir: str) -> None:
        self._check_open()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(local_dir, arcname=".")
        await self._extract(buf.getvalue(), self._path(remote_dir))

    async def _extract(self, payload: bytes, remote_dir: str) -> None:
        staged = f"{_UPLOAD_TMP}/farm-upload-{uuid.uuid4().hex}.tar"
        await self._retrying(lambda: self._sdk.files.write(staged, payload, user=self._cfg.user), f"upload {staged}")
        q_dir, q_tar = shlex.quote(remote_dir), shlex.quote(staged)
        res = await self.exec(f"mkdir -p {q_dir} && tar -xf {q_tar} -C {q_dir}; rc=$?; rm -f {q_tar}; exit $rc", timeout=600)
        if res.exit_code != 0:
            raise SandboxError(f"extracting into {remote_dir} in sandbox {self.id} failed: {res.stderr.strip()[-1000:]}")

    # --- lifecycle -------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    # --- network and limits: E2B sandboxes run off the cluster network, in their own VM ---
    async def isolate_network(self) -> None:
        """No-op: an E2B sandbox never shares the cluster's network."""

    async def forward_port(self, port: int) -> str | None:
        return None  # it reaches the gateway by URL

    @property
    def network_policy(self) -> dict[str, str]:
        return {"setup": "e2b", "agent": "e2b", "forwarded_ports": ""}

    @property
    def limits_policy(self) -> dict[str, str]:
        return {}  # the VM's own limits (its template's CPU and memory) apply

    @property
    def breaches(self) -> list[str]:
        return []  # the VM's own limits end it; no per-sandbox accounting here

    def busy_processes(self) -> int | None:
        return None  # no process accounting inside the VM from here

    async def close(self) -> None:
        """Kill the E2B sandbox (retried; a sandbox already gone counts as killed)."""
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.ensure_future(self._close())
        await asyncio.shield(self._close_task)

    async def _close(self) -> None:
        try:
            await asyncio.gather(*(p.kill() for p in list(self._procs)), return_exceptions=True)
            await self._retrying(self._sdk.kill, "kill")
        finally:
            self._run_close_callbacks()


async def reap(
    run_id: str, *, api_key: str, cfg: E2BSandboxConfig, sdk: Any = AsyncSandbox,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> list[str]:
    """Kill every E2B sandbox whose metadata has ``run_id``; returns their ids."""
    opts: dict[str, Any] = {"api_key": api_key, "request_timeout": cfg.request_timeout_s}
    if cfg.domain:
        opts["domain"] = cfg.domain
    paginator = sdk.list(query=SandboxQuery(metadata={"run_id": run_id}), **opts)
    found: list[str] = []
    while paginator.has_next:
        page = await call_with_retries(
            paginator.next_items, what="E2B list sandboxes", retries=cfg.retries, backoff_s=cfg.backoff_s, sleep=sleep
        )
        found.extend(info.sandbox_id for info in page if info.metadata.get("run_id") == run_id)
    for sandbox_id in found:
        await call_with_retries(
            lambda sid=sandbox_id: sdk.kill(sid, **opts),
            what=f"E2B kill {sandbox_id}",
            retries=cfg.retries,
            backoff_s=cfg.backoff_s,
            sleep=sleep,
        )
    return found
