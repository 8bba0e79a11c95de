"""The Sandbox protocol contract, run against every backend.

local: always (real bubblewrap jails). e2b: only when E2B_API_KEY is set (the E2B cloud
is not reachable from CI machines without a key); skipped with the reason otherwise.
"""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sandbox_testutil import host_pids_with

from farm.errors import SandboxClosed, SandboxFileNotFound, SandboxTimeout
from farm.sandboxes.base import BackgroundProcess, Sandbox, SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.factory import create_sandbox
from testkit.waits import async_wait_until

E2B_KEY = os.environ.get("E2B_API_KEY")
BACKENDS = [
    "local",
    pytest.param(
        "e2b",
        marks=pytest.mark.skipif(
            not E2B_KEY, reason="E2B_API_KEY is not set: the E2B contract run needs the E2B cloud"
        ),
    ),
]


@pytest.fixture(params=BACKENDS)
async def sandbox(request: pytest.FixtureRequest, local_cfg: SandboxConfig) -> AsyncIterator[Sandbox]:
    labels = {"run_id": f"contract-{uuid.uuid4().hex[:8]}", "rollout_id": "r0"}
    if request.param == "local":
        sb = await create_sandbox(local_cfg, SandboxSpec(labels=labels, env={"SPEC_VAR": "from-spec"}))
    else:
        cfg = SandboxConfig(backend="e2b")
        sb = await create_sandbox(
            cfg, SandboxSpec(labels=labels, env={"SPEC_VAR": "from-spec"}, timeout_s=600), e2b_api_key=E2B_KEY
        )
    try:
        yield sb
    finally:
        await sb.close()


async def leftover(sb: Sandbox, marker: str) -> list[int]:
    """Processes still running whose command line holds ``marker``."""
    if sb.__class__.__name__ == "LocalSandbox":
        return host_pids_with(marker)
    res = await sb.exec(f"pgrep -f {marker} || true")
    return [int(x) for x in res.stdout.split() if x.isdigit()]


async def eventually_empty(fn: Callable[[], object], sb: Sandbox, marker: str) -> list[int]:
    for _ in range(50):
        pids = await leftover(sb, marker)
        if not pids:
            return pids
        await asyncio.sleep(0.1)  # poll: 50 tries bound the wait
    return pids


async def test_is_a_sandbox(sandbox: Sandbox) -> None:
    assert isinstance(sandbox, Sandbox)
    assert sandbox.labels["rollout_id"] == "r0"
    assert sandbox.home.startswith(sandbox.root) or sandbox.root.startswith(sandbox.home)


async def test_exec_stdout_stderr_exit_code(sandbox: Sandbox) -> None:
    res = await sandbox.exec("echo out; echo err >&2; exit 7")
    assert (res.exit_code, res.stdout, res.stderr) == (7, "out\n", "err\n")
    assert not res.ok
    ok = await sandbox.exec(["printf", "%s|", "a b", "c"])
    assert ok.ok and ok.stdout == "a b|c|"


async def test_env_and_cwd(sandbox: Sandbox) -> None:
    await sandbox.exec("mkdir -p sub/dir")
    res = await sandbox.exec('echo "$SPEC_VAR $CALL_VAR $HOME"; pwd', cwd="sub/dir", env={"CALL_VAR": "from-call"})
    line, cwd = res.stdout.splitlines()
    assert line == f"from-spec from-call {sandbox.home}"
    assert cwd == f"{sandbox.root}/sub/dir"
    default = await sandbox.exec("pwd")
    assert default.stdout.strip() == sandbox.root


async def test_timeout_kills_whole_tree(sandbox: Sandbox) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}"
    cmd = f"sleep {marker} & (setsid sleep {marker} &) ; sleep {marker}"
    with pytest.raises(SandboxTimeout) as err:
        await sandbox.exec(cmd, timeout=1.0)
    assert cmd in str(err.value) and "1 s" in str(err.value)
    assert await eventually_empty(leftover, sandbox, marker) == []
    # the sandbox is still usable
    assert (await sandbox.exec("echo alive")).stdout == "alive\n"


async def test_background_wait_and_kill(sandbox: Sandbox) -> None:
    proc = await sandbox.start("sleep 0.3; echo bg-done; exit 3")
    assert isinstance(proc, BackgroundProcess)
    res = await proc.wait(timeout=30)
    assert (res.exit_code, res.stdout) == (3, "bg-done\n")

    marker = f"{uuid.uuid4().int % 10**6 + 2 * 10**6}"
    long = await sandbox.start(f"sleep {marker} & sleep {marker}")
    await async_wait_until(lambda: leftover(sandbox, marker), what="its processes running")
    await long.kill()
    await long.kill()  # idempotent
    assert await eventually_empty(leftover, sandbox, marker) == []

    slow = await sandbox.start("sleep 300")
    with pytest.raises(SandboxTimeout):
        await slow.wait(timeout=0.5)


async def test_files_text_and_bytes(sandbox: Sandbox) -> None:
    await sandbox.write_file("notes/a.txt", "héllo\n")
    blob = bytes(range(256)) * 10
    await sandbox.write_file(f"{sandbox.root}/bin.dat", blob)
    assert await sandbox.read_file("notes/a.txt") == "héllo\n".encode()
    assert await sandbox.read_file("bin.dat") == blob
    res = await sandbox.exec("cat notes/a.txt; wc -c < bin.dat")
    assert res.stdout == "héllo\n2560\n"
    await sandbox.exec("echo made-inside > inside.txt")
    assert await sandbox.read_file("inside.txt") == b"made-inside\n"
    await sandbox.write_file("/tmp/scratch.txt", "tmp")
    assert (await sandbox.exec("cat /tmp/scratch.txt")).stdout == "tmp"
    with pytest.raises(SandboxFileNotFound):
        await sandbox.read_file("missing.txt")
    assert await sandbox.read_tail("bin.dat", 5) == blob[-5:]  # a log's end, not all of it
    assert await sandbox.read_tail("notes/a.txt", 1000) == "héllo\n".encode()
    with pytest.raises(SandboxFileNotFound):
        await sandbox.read_tail("missing.txt", 10)
    # several files in one call (local: one worker-thread job), parents made, in order
    await sandbox.write_files({"many/x/1.txt": "one", f"{sandbox.root}/many/2.bin": b"\0two", "/tmp/many.txt": "t"})
    res = await sandbox.exec("cat many/x/1.txt; od -An -c many/2.bin | tr -d ' '; cat /tmp/many.txt")
    assert res.stdout == "one\\0two\nt"


async def test_upload_dir_and_tarball(sandbox: Sandbox, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "mod.py").write_text("X = 1\n")
    (src / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (src / "run.sh").chmod(0o755)
    await sandbox.upload_dir(str(src), "repo")
    res = await sandbox.exec("cat pkg/mod.py && ./run.sh", cwd="repo")
    assert res.stdout == "X = 1\nran\n", res

    tar_path = tmp_path / "t.tar.gz"
    with tarfile.open(tar_path, "w:gz") as tar:
        data = b"from tar\n"
        info = tarfile.TarInfo("d/inner.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    await sandbox.upload_tarball(str(tar_path), "unpacked")
    assert await sandbox.read_file("unpacked/d/inner.txt") == b"from tar\n"


async def test_close_twice_and_use_after_close(sandbox: Sandbox) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 3 * 10**6}"
    await sandbox.start(f"sleep {marker}")
    await sandbox.close()
    await sandbox.close()
    if sandbox.__class__.__name__ == "LocalSandbox":
        assert await eventually_empty(leftover, sandbox, marker) == []
    with pytest.raises(SandboxClosed):
        await sandbox.exec("true")
    with pytest.raises(SandboxClosed):
        await sandbox.start("true")
    with pytest.raises(SandboxClosed):
        await sandbox.read_file("x")
    with pytest.raises(SandboxClosed):
        await sandbox.write_file("x", "y")


async def test_async_with_closes(local_cfg: SandboxConfig) -> None:
    async with await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "ctx"})) as sb:
        assert (await sb.exec("true")).ok
    with pytest.raises(SandboxClosed):
        await sb.exec("true")
