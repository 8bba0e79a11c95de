"""E2BSandbox without the network: the SDK's own exception classes and a fake SDK object.

The E2B cloud cannot be reached from here; the real-cloud run is the contract suite
with E2B_API_KEY set. These tests pin what farm does with each SDK behaviour: exit
codes as results, timeouts, retries (idempotent calls only), error mapping, reap.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    CommandResult,
    FileNotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotRunningException,
    SandboxUnreachableException,
    ServiceBusyException,
)

from farm.errors import SandboxAuthError, SandboxClosed, SandboxError, SandboxFileNotFound, SandboxTimeout
from farm.sandboxes import e2b as e2b_mod
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.sandboxes.config import E2BSandboxConfig, SandboxConfig
from farm.sandboxes.e2b import E2BSandbox, is_retryable, map_error, reap, retry_delays
from farm.sandboxes.factory import create_sandbox


class FakeHandle:
    def __init__(self, script: dict[str, Any], on_stdout: Any, on_stderr: Any) -> None:
        self.script = script
        self.on_stdout, self.on_stderr = on_stdout, on_stderr
        self.killed = asyncio.Event()

    async def wait(self) -> CommandResult:
        for chunk in self.script.get("stdout", []):
            self.on_stdout(chunk)
        for chunk in self.script.get("stderr", []):
            self.on_stderr(chunk)
        if self.script.get("hang"):
            await self.killed.wait()
            raise SandboxException("killed")
        if "raise" in self.script:
            raise self.script["raise"]
        code = self.script.get("exit_code", 0)
        if code != 0:  # what the SDK does with retain_output=False
            raise CommandExitException(stdout=None, stderr=None, exit_code=code, error="exit status")
        return CommandResult(stdout=None, stderr=None, exit_code=0, error=None)

    async def kill(self) -> bool:
        self.killed.set()
        return True

    async def disconnect(self) -> None:
        pass


@dataclass
class FakeCommands:
    scripts: list[dict[str, Any]] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    handles: list[FakeHandle] = field(default_factory=list)

    async def run(self, cmd: str, **kw: Any) -> FakeHandle:
        self.calls.append({"cmd": cmd, **kw})
        script = self.scripts.pop(0) if self.scripts else {}
        if "start_raise" in script:
            raise script["start_raise"]
        handle = FakeHandle(script, kw["on_stdout"], kw["on_stderr"])
        self.handles.append(handle)
        return handle


@dataclass
class FakeFiles:
    data: dict[str, bytes] = field(default_factory=dict)
    failures: list[BaseException] = field(default_factory=list)
    calls: int = 0

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)

    async def write(self, path: str, data: str | bytes, user: str | None = None) -> None:
        self._maybe_fail()
        self.data[path] = data.encode() if isinstance(data, str) else data

    async def read(self, path: str, format: str = "text", user: str | None = None) -> bytearray:
        self._maybe_fail()
        if path not in self.data:
            raise FileNotFoundException(f"path '{path}' does not exist")
        return bytearray(self.data[path])


class FakeSdkSandbox:
    def __init__(self, sandbox_id: str = "sbx-1") -> None:
        self.sandbox_id = sandbox_id
        self.commands = FakeCommands()
        self.files = FakeFiles()
        self.kills = 0
        self.kill_failures: list[BaseException] = []

    async def kill(self) -> bool:
        self.kills += 1
        if self.kill_failures:
            raise self.kill_failures.pop(0)
        return True


async def _no_sleep(_: float) -> None:
    return None


def make(cfg: E2BSandboxConfig | None = None) -> tuple[E2BSandbox, FakeSdkSandbox]:
    fake = FakeSdkSandbox()
    sb = E2BSandbox(fake, cfg or E2BSandboxConfig(), SandboxSpec(labels={"run_id": "r"}), sleep=_no_sleep)
    return sb, fake


async def test_exit_codes_are_results_and_output_is_captured() -> None:
    sb, fake = make()
    assert isinstance(sb, Sandbox)
    fake.commands.scripts = [{"stdout": ["o1", "o2\n"], "stderr": ["e\n"], "exit_code": 3}, {"stdout": ["ok"]}]
    res = await sb.exec(["echo", "a b"], cwd="w", env={"K": "V"})
    assert (res.exit_code, res.stdout, res.stderr) == (3, "o1o2\n", "e\n")
    call = fake.commands.calls[0]
    assert call["cmd"] == "echo 'a b'" and call["background"] is True and call["timeout"] == 0
    assert call["cwd"] == "/home/user/w" and call["envs"] == {"K": "V"} and call["user"] == "user"
    assert call["retain_output"] is False
    assert (await sb.exec("true")).stdout == "ok"


async def test_timeout_kills_the_command_and_raises() -> None:
    sb, fake = make()
    fake.commands.scripts = [{"hang": True}]
    with pytest.raises(SandboxTimeout, match=r"'sleep 99' exceeded its timeout of 0.2 s"):
        await sb.exec("sleep 99", timeout=0.2)
    assert fake.commands.handles[0].killed.is_set()


async def test_background_process_wait_and_kill() -> None:
    sb, fake = make()
    fake.commands.scripts = [{"hang": True}]
    proc = await sb.start("serve")
    await proc.kill()
    assert fake.commands.handles[0].killed.is_set()


async def test_commands_are_never_retried() -> None:
    sb, fake = make()
    fake.commands.scripts = [{"start_raise": SandboxUnreachableException("network down")}]
    with pytest.raises(SandboxError, match="network down"):
        await sb.exec("make")
    assert len(fake.commands.calls) == 1


async def test_idempotent_file_calls_retry_transient_errors_only() -> None:
    sb, fake = make(E2BSandboxConfig(retries=2))
    fake.files.failures = [RateLimitException("429"), ServiceBusyException("503")]
    await sb.write_file("a.txt", "hi")
    assert fake.files.data["/home/user/a.txt"] == b"hi" and fake.files.calls == 3
    fake.files.failures = [SandboxUnreachableException("x")] * 3
    with pytest.raises(SandboxError):
        await sb.read_file("a.txt")
    assert fake.files.calls == 6  # 1 + 2 retries
    fake.files.failures = [SandboxException("bad request")]
    with pytest.raises(SandboxError, match="bad request"):
        await sb.read_file("a.txt")
    assert fake.files.calls == 7  # not retried
    assert await sb.read_file("/home/user/a.txt") == b"hi"
    with pytest.raises(SandboxFileNotFound):
        await sb.read_file("missing")
    await sb.write_files({"b.txt": "b", "/tmp/c.bin": b"c"})  # each its own (retried) write, in order
    assert fake.files.data["/home/user/b.txt"] == b"b" and fake.files.data["/tmp/c.bin"] == b"c"


async def test_upload_dir_stages_a_tarball_and_extracts_it(tmp_path: Path) -> None:
    sb, fake = make()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.txt").write_text("x")
    await sb.upload_dir(str(tmp_path / "d"), "repo")
    (staged,) = [p for p in fake.files.data if p.startswith("/tmp/farm-upload-")]
    with tarfile.open(fileobj=io.BytesIO(fake.files.data[staged])) as tar:
        assert "./f.txt" in tar.getnames()
    cmd = fake.commands.calls[-1]["cmd"]
    assert "mkdir -p /home/user/repo" in cmd and f"tar -xf {staged} -C /home/user/repo" in cmd


async def test_close_is_idempotent_and_retried() -> None:
    sb, fake = make()
    fake.kill_failures = [SandboxUnreachableException("blip")]
    released: list[int] = []
    sb.add_close_callback(lambda: released.append(1))
    await sb.close()
    await sb.close()
    assert fake.kills == 2 and released == [1]
    with pytest.raises(SandboxClosed):
        await sb.exec("true")
    with pytest.raises(SandboxClosed):
        await sb.write_file("x", "y")


def test_error_mapping() -> None:
    auth = map_error(AuthenticationException("Invalid API key"), "create")
    assert isinstance(auth, SandboxAuthError) and "E2B_API_KEY" in str(auth)
    assert not issubclass(AuthenticationException, SandboxException)  # why it needs its own branch
    assert isinstance(map_error(FileNotFoundException("nope"), "read"), SandboxFileNotFound)
    assert "gone" in str(map_error(SandboxNotRunningException("was not found"), "exec"))
    assert "rate limiting" in str(map_error(RateLimitException("slow down"), "create"))
    assert type(map_error(SandboxException("boom"), "x")) is SandboxError


def test_retry_policy() -> None:
    assert is_retryable(RateLimitException("x"))
    assert is_retryable(ServiceBusyException("x"))
    assert is_retryable(SandboxUnreachableException("x"))
    assert is_retryable(httpx.ConnectError("x"))
    assert not is_retryable(SandboxNotRunningException("was not found"))
    assert not is_retryable(AuthenticationException("x"))
    assert not is_retryable(SandboxException("x"))
    assert retry_delays(4, 1.0) == [1.0, 2.0, 4.0, 8.0]
    assert retry_delays(8, 10.0)[-1] == 30.0


class FakeSdkClass:
    """Stands in for ``AsyncSandbox`` (create / list / kill classmethods)."""

    def __init__(self) -> None:
        self.create_calls: list[dict[str, Any]] = []
        self.create_failures: list[BaseException] = []
        self.live: dict[str, dict[str, str]] = {}
        self.killed: list[str] = []

    async def create(self, **kw: Any) -> FakeSdkSandbox:
        self.create_calls.append(kw)
        if self.create_failures:
            raise self.create_failures.pop(0)
        sid = f"sbx-{len(self.live)}"
        self.live[sid] = kw["metadata"]
        return FakeSdkSandbox(sid)

    def list(self, query: Any, **opts: Any) -> Any:
        items = [
            type("Info", (), {"sandbox_id": sid, "metadata": md})()
            for sid, md in self.live.items()
            if all(md.get(k) == v for k, v in query.metadata.items())
        ]
        pages = [items[:1], items[1:]]

        class Pager:
            has_next = True

            async def next_items(self) -> list[Any]:
                page = pages.pop(0)
                Pager.has_next = bool(pages)
                return page

        return Pager()

    async def kill(self, sandbox_id: str, **opts: Any) -> bool:
        self.killed.append(sandbox_id)
        self.live.pop(sandbox_id, None)
        return True


async def test_create_passes_labels_template_key_and_retries_with_same_idempotency_key() -> None:
    sdk = FakeSdkClass()
    sdk.create_failures = [ServiceBusyException("no capacity")]
    spec = SandboxSpec(labels={"run_id": "r1", "rollout_id": "x"}, image="swe-img", env={"A": "1"}, timeout_s=900)
    sb = await E2BSandbox.create(E2BSandboxConfig(template="base"), spec, api_key="k", sdk=sdk, sleep=_no_sleep)
    first, second = sdk.create_calls
    assert first["idempotency_key"] == second["idempotency_key"]
    assert second["template"] == "swe-img" and second["metadata"] == spec.labels and second["timeout"] == 900
    assert second["api_key"] == "k" and second["envs"] == {"A": "1"}
    assert sb.id == "sbx-0"


async def test_create_with_bad_key_is_a_clear_auth_error() -> None:
    sdk = FakeSdkClass()
    sdk.create_failures = [AuthenticationException("401: Invalid API key")]
    with pytest.raises(SandboxAuthError, match="E2B_API_KEY"):
        await E2BSandbox.create(E2BSandboxConfig(), SandboxSpec(), api_key="bad", sdk=sdk, sleep=_no_sleep)
    assert len(sdk.create_calls) == 1  # not retried


async def test_factory_requires_an_api_key_for_e2b() -> None:
    with pytest.raises(SandboxError, match="E2B_API_KEY"):
        await create_sandbox(SandboxConfig(backend="e2b"), SandboxSpec())


async def test_reap_kills_only_the_runs_sandboxes() -> None:
    sdk = FakeSdkClass()
    for run in ("r1", "r1", "other"):
        await E2BSandbox.create(E2BSandboxConfig(), SandboxSpec(labels={"run_id": run}), api_key="k", sdk=sdk)
    killed = await reap("r1", api_key="k", cfg=E2BSandboxConfig(), sdk=sdk, sleep=_no_sleep)
    assert sorted(killed) == ["sbx-0", "sbx-1"] and list(sdk.live) == ["sbx-2"]


def test_module_reads_no_environment() -> None:
    source = Path(e2b_mod.__file__).read_text()
    assert "os.environ" not in source and "getenv" not in source


async def test_read_tail_runs_tail_inside_and_maps_a_missing_file() -> None:
    sb, fake = make()
    fake.commands.scripts = [{"stdout": ["last bytes"]}, {"stderr": ["tail: cannot open 'x': No such file or directory"],
                                                           "exit_code": 1}]  # fmt: skip
    assert await sb.read_tail("logs/out.txt", 10) == b"last bytes"
    assert "tail -c 10 /home/user/logs/out.txt" in fake.commands.calls[0]["cmd"]
    with pytest.raises(SandboxFileNotFound):
        await sb.read_tail("x", 10)


async def test_an_e2b_sandbox_reaches_its_own_actors_gateway_by_its_public_url() -> None:
    """E2B on many nodes: a sandbox actor's E2B sandboxes are handed the URL its gateway.public_url
    template gives that actor (its node's facts as the actor fills them, its gateway's bound port),
    with nothing forwarded: another actor's template gives another URL."""
    from farm.config import FarmConfig
    from farm.gateway.config import fill_url
    from farm.gateway.public_url import public_url
    from farm.rollout.actor_layers import ActorLayers

    cfg = FarmConfig.model_validate({"sandbox": {"backend": "e2b"}, "ray": {"num_sandbox_actors": 2},
                                     "gateway": {"public_url": "https://gw-{node_id}.example.com:{port}"}})  # fmt: skip
    urls = []
    for node, port in (("node-a", 41001), ("node-b", 41002)):  # two actors, as farm.actors.sandbox fills them in
        layers = ActorLayers(cfg, "http://engine")
        layers.gateway_url = public_url(fill_url(cfg.gateway.public_url, node_id=node), port)
        sb, fake = make()
        url, socket = await layers._isolate(sb)
        urls.append(url)
        assert socket is None and fake.commands.calls == []  # no port forwarding, no relay in the VM
    assert urls == ["https://gw-node-a.example.com:41001", "https://gw-node-b.example.com:41002"]
