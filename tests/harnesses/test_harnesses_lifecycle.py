"""The shared lifecycle in real local sandboxes: configure, budget, crash, gateway loss,
cancellation, upload when the sandbox cannot see the host cache.

The "CLI" here is a bash script installed through ``harness.bin_path`` (the path an
E2B template with a preinstalled CLI uses), so each failure mode is exact and fast;
the real CLIs go through the same code in test_harnesses_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest

from farm.harnesses import make_harness
from farm.harnesses.base import HarnessRun
from farm.harnesses.config import HarnessConfig
from farm.harnesses.install import COMPLETE_MARKER, pinned_package
from farm.sandboxes.local import sandbox_pids
from farm.harnesses.plan import HarnessEnd

from harness_testutil import free_port, host_pids_with
from testkit.waits import async_wait_until


async def install_script(sandbox, body: str) -> str:
    path = f"{sandbox.root}/fake-cli"
    await sandbox.write_file(path, "#!/bin/bash\n" + body)
    res = await sandbox.exec(["chmod", "+x", path])
    assert res.ok, res.stderr
    return path


def make_run(sandbox, url: str, budget: float = 30.0, **kw) -> HarnessRun:
    return HarnessRun(
        instruction='Fix "it".\nSecond line with $HOME and `ticks`.',
        gateway_url=url,
        api_key="secret-" + uuid.uuid4().hex,
        model="farm-policy",
        workdir=f"{sandbox.root}/repo",
        budget_s=budget,
        **kw,
    )


async def prepared(sandbox, body: str, **cfg) -> object:
    await sandbox.exec(["mkdir", "-p", f"{sandbox.root}/repo"])
    path = await install_script(sandbox, body)
    return make_harness(HarnessConfig(name="claude_code", bin_path=path, **cfg))


async def test_configure_writes_scratch_outside_workdir(sandbox, gateway) -> None:
    h = make_harness(
        HarnessConfig(name="codex", extra_args=["--color", "never"], extra_env={"FARM_X": "1", "CODEX_HOME": "/x"})
    )
    run = make_run(sandbox, gateway.base_url, env={"PATH": "/opt/py/bin:/usr/bin:/bin", "FARM_GATEWAY_KEY": "no"})
    await sandbox.exec(["mkdir", "-p", run.workdir])
    stale = f"{sandbox.tmp}/.farm/harness/stale.txt"
    await sandbox.write_file(stale, "old")
    plan = await h.configure(sandbox, run)
    scratch = plan.scratch_dir
    assert not scratch.startswith(run.workdir)
    assert plan.cwd == run.workdir
    assert plan.argv[0] == plan.binary and plan.argv[-2:] == ["--color", "never"]
    assert plan.env["HOME"] == f"{scratch}/home"
    assert plan.env["PATH"] == "/opt/py/bin:/usr/bin:/bin"  # the task's env reaches the CLI...
    assert plan.env["FARM_GATEWAY_KEY"] == run.api_key  # ...but cannot override the CLI's own settings
    assert plan.env["FARM_X"] == "1" and plan.env["CODEX_HOME"] == "/x"  # extra_env wins over everything
    assert (await sandbox.read_file(plan.stdin_path)).decode() == run.instruction
    assert sorted(plan.files_written) == sorted(
        [plan.stdin_path, f"{scratch}/home/.bash_profile", f"{scratch}/codex-home/config.toml"]
    )
    # Login shells (Codex runs `bash -lc`) keep the CLI's PATH although /etc/profile resets it.
    login = await sandbox.exec(
        ["bash", "-c", 'export FARM_LOGIN_PATH="$PATH"; exec bash -lc \'echo "$PATH"\''], env=plan.env, cwd=plan.cwd
    )
    assert login.stdout.strip() == "/opt/py/bin:/usr/bin:/bin", login
    for path in plan.files_written:
        await sandbox.read_file(path)
    with pytest.raises(Exception):
        await sandbox.read_file(stale)  # a fresh scratch dir per configure
    assert (await sandbox.exec(["test", "-d", plan.env["HOME"]])).ok
    assert run.api_key not in plan.shell_command()


async def test_completed_run_collects_stream_and_final_message(sandbox, gateway) -> None:
    result_line = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": "all done"})
    h = await prepared(
        sandbox,
        'echo \'{"type":"system","subtype":"init"}\'\necho not-json\n'
        f"cat > got-stdin.txt\necho '{result_line}'\necho 'a warning' >&2\n",
    )
    run = make_run(sandbox, gateway.base_url)
    res = await h.run(sandbox, run)
    assert res.end is HarnessEnd.FINISHED, res.reason
    assert res.exit_code == 0 and not res.timed_out
    assert [e["type"] for e in res.events] == ["system", "result"] and res.non_json_lines == 1
    assert res.final_message == "all done"
    assert res.stderr_tail == "a warning\n"
    assert (await sandbox.read_file(f"{run.workdir}/got-stdin.txt")).decode() == run.instruction
    assert res.diff_excludes == [] and res.files_written


async def test_hang_past_budget_kills_the_whole_tree(sandbox, gateway) -> None:
    marker = f"{3000 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 1000}"
    h = await prepared(
        sandbox,
        f'echo \'{{"type":"system","subtype":"init"}}\'\n(sleep {marker}; echo never) &\nsleep {marker}\n',
        watch_interval_s=0,
    )
    res = await h.run(sandbox, make_run(sandbox, gateway.base_url, budget=1.5))
    assert res.end is HarnessEnd.TIMED_OUT
    assert res.timed_out and res.exit_code is None
    assert "1.5 s budget" in res.reason and "killed" in res.reason
    assert [e["type"] for e in res.events] == ["system"]  # the partial stream survives the kill
    assert not host_pids_with(f"sleep {marker}")
    assert not sandbox_pids(sandbox.id)


async def test_crash_is_agent_error_with_stderr_tail(sandbox, gateway) -> None:
    h = await prepared(sandbox, "echo 'starting up' >&2\necho 'fatal: out of cheese at line 42' >&2\nexit 3\n")
    res = await h.run(sandbox, make_run(sandbox, gateway.base_url))
    assert res.end is HarnessEnd.EXITED
    assert res.exit_code == 3
    assert res.reason == "claude_code exited 3: fatal: out of cheese at line 42"
    assert "starting up" in res.stderr_tail and "out of cheese" in res.stderr_tail


async def test_error_in_stream_with_exit_zero_is_agent_error(sandbox, gateway) -> None:
    line = json.dumps({"type": "result", "subtype": "error_max_turns", "is_error": True, "result": "too many turns"})
    h = await prepared(sandbox, f"echo '{line}'\n")
    res = await h.run(sandbox, make_run(sandbox, gateway.base_url))
    assert res.end is HarnessEnd.ERROR_REPORTED and res.exit_code == 0
    assert res.reason == "claude_code reported an error: error_max_turns: too many turns"


async def test_gateway_unreachable_before_launch(sandbox, gateway) -> None:
    h = await prepared(sandbox, "touch started\n", probe_timeout_s=1.5)
    dead = f"http://127.0.0.1:{free_port()}"
    res = await h.run(sandbox, make_run(sandbox, dead))
    assert res.end is HarnessEnd.GATEWAY_UNREACHABLE
    assert "unreachable from the sandbox" in res.reason and "not started" in res.reason
    assert res.exit_code is None and res.events == []
    assert not (await sandbox.exec(["test", "-e", f"{sandbox.root}/repo/started"])).ok


async def test_the_launch_waits_for_a_gateway_still_starting(sandbox) -> None:
    """The CLI's command asks the gateway again until probe_timeout_s: one that starts
    listening a moment late is reached and the CLI runs."""
    h = await prepared(sandbox, "touch started\n", probe_timeout_s=8)
    port = free_port()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    running = asyncio.ensure_future(h.run(sandbox, make_run(sandbox, f"http://127.0.0.1:{port}")))
    await asyncio.sleep(1.5)  # refused meanwhile
    server = await asyncio.start_server(answer, "127.0.0.1", port)
    try:
        res = await asyncio.wait_for(running, 60)
    finally:
        server.close()
    assert res.end is HarnessEnd.FINISHED, res.reason
    assert (await sandbox.exec(["test", "-e", f"{sandbox.root}/repo/started"])).ok


async def test_a_cli_cannot_pass_for_an_unreachable_gateway(sandbox, gateway) -> None:
    """The wrapper's own stderr says the gateway was unreachable; a CLI that prints the same
    words and exits with the same code is a CLI that exited (its stderr is its file)."""
    h = await prepared(sandbox, "echo 'farm: gateway unreachable: nope' >&2\nexit 86\n")
    res = await h.run(sandbox, make_run(sandbox, gateway.base_url))
    assert res.end is HarnessEnd.EXITED and res.exit_code == 86, res.reason


async def test_gateway_lost_during_run_stops_the_cli(sandbox, gateway) -> None:
    marker = f"{4000 + uuid.uuid4().int % 1000}.5"
    h = await prepared(sandbox, f"sleep {marker}\n", watch_interval_s=0.3, max_failed_probes=2, probe_timeout_s=1)
    task = asyncio.ensure_future(h.run(sandbox, make_run(sandbox, gateway.base_url, budget=120)))
    await asyncio.sleep(1.0)  # the CLI runs with a live gateway a while: probes pass
    assert not task.done()
    await gateway.stop()
    res = await asyncio.wait_for(task, 60)
    assert res.end is HarnessEnd.MODEL_PATH_LOST
    assert "unreachable from the sandbox during the run" in res.reason
    assert not res.timed_out
    assert not host_pids_with(f"sleep {marker}")


@pytest.mark.parametrize("idle_s", [0.0, 100.0], ids=["served", "quiet"])
async def test_the_watch_probes_only_a_session_the_gateway_has_not_served(sandbox, gateway, idle_s) -> None:
    """A session the gateway served within the watch interval is not probed (the request
    proved the path); a quiet one is, and a dead path then stops the CLI as before."""
    h = await prepared(sandbox, "sleep 3\n", watch_interval_s=0.3, max_failed_probes=2, probe_timeout_s=1)
    task = asyncio.ensure_future(h.run(sandbox, make_run(sandbox, gateway.base_url, budget=120),
                                       session_idle_s=lambda: idle_s))
    await asyncio.sleep(1.0)  # the CLI runs with a live gateway a while: probes pass
    await gateway.stop()
    res = await asyncio.wait_for(task, 60)
    if idle_s == 0.0:
        assert res.end is HarnessEnd.FINISHED, res.reason
    else:
        assert res.end is HarnessEnd.MODEL_PATH_LOST
        assert "unreachable from the sandbox during the run" in res.reason


async def test_cli_stuck_retrying_is_stopped(sandbox, gateway) -> None:
    retry = {"type": "system", "subtype": "api_retry", "max_retries": 10, "error_status": 401, "error": "authentication_failed"}
    lines = "\n".join(f"echo '{json.dumps({**retry, 'attempt': i})}'; sleep 0.1" for i in range(1, 4))
    h = await prepared(sandbox, f"{lines}\nsleep 600\n", watch_interval_s=0.3, max_client_retries=3)
    res = await asyncio.wait_for(h.run(sandbox, make_run(sandbox, gateway.base_url, budget=120)), 60)
    assert res.end is HarnessEnd.MODEL_PATH_LOST
    assert "stuck retrying model requests" in res.reason and "HTTP 401" in res.reason


async def test_cancelled_launch_kills_the_cli(sandbox, gateway) -> None:
    marker = f"{5000 + uuid.uuid4().int % 1000}.5"
    h = await prepared(sandbox, f"sleep {marker}\n", watch_interval_s=0)
    task = asyncio.ensure_future(h.run(sandbox, make_run(sandbox, gateway.base_url, budget=120)))
    await async_wait_until(lambda: host_pids_with(f"sleep {marker}"), timeout_s=10, what="the CLI running")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not host_pids_with(f"sleep {marker}")


async def test_configure_runs_one_command_and_still_finds_a_cli_it_cannot_run(sandbox, gateway, monkeypatch) -> None:
    """Each command a sandbox runs is a jail's start: configure makes its scratch dir and checks
    the CLI where the sandbox sees it in one command, and the launch asks the gateway in the
    CLI's own command (no probe of its own); a CLI that is not executable there is still
    bin_path's precise error."""
    from farm.errors import HarnessInstallError

    run = make_run(sandbox, gateway.base_url)
    await sandbox.exec(["mkdir", "-p", run.workdir])
    script = await install_script(sandbox, "true")
    h = make_harness(HarnessConfig(name="claude_code", bin_path=script))
    ran: list = []
    real_exec = sandbox.exec

    async def counted(cmd, **kw):
        ran.append(cmd)
        return await real_exec(cmd, **kw)

    monkeypatch.setattr(sandbox, "exec", counted)
    plan = await h.configure(sandbox, run)
    assert len(ran) == 1 and plan.binary == script, ran
    ran.clear()
    res = await h.run(sandbox, run)  # the CLI (a script) ends at once; the probe ran in its command
    assert res.exit_code == 0 and res.end is HarnessEnd.FINISHED and len(ran) == 1, ran
    await real_exec(["chmod", "-x", script])
    with pytest.raises(HarnessInstallError, match="bin_path .* is not executable"):
        await h.configure(sandbox, run)


async def test_bin_path_missing_is_an_install_error(sandbox) -> None:
    from farm.errors import HarnessInstallError

    h = make_harness(HarnessConfig(name="opencode", bin_path="/nonexistent/opencode"))
    with pytest.raises(HarnessInstallError, match="bin_path"):
        await h.provision(sandbox)


def fake_claude_cache(tmp_path: Path) -> Path:
    """A host npm cache holding the pinned Claude Code package, whose CLI prints where it ran from."""
    if os.uname().machine not in ("x86_64", "amd64"):
        pytest.skip("the fake platform package is x64")
    prefix = tmp_path / "npm-cache" / pinned_package("claude_code").dirname
    native = prefix / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64"
    native.mkdir(parents=True)
    (native / "package.json").write_text('{"name": "@anthropic-ai/claude-code-linux-x64"}')
    (native / "claude").write_text('#!/bin/bash\necho "{\\"type\\":\\"result\\",\\"result\\":\\"ran from $0\\"}"\n')
    os.chmod(native / "claude", 0o755)
    (prefix / COMPLETE_MARKER).write_text("{}")
    return prefix


async def test_a_cli_the_sandbox_shows_is_checked_once_then_configure_runs_no_command(
    sandbox_cfg, gateway, tmp_path: Path
) -> None:
    """A host CLI a local sandbox shows read-only cannot change in there: found executable by
    configure's command in one sandbox, it is not checked again in the next of its kind.
    There configure runs no command (the scratch dir emptied and written from outside), and
    the CLI's own command is the sandbox's first: its jail proven when it ends."""
    from farm.sandboxes.base import SandboxSpec
    from farm.sandboxes.factory import open_sandbox

    prefix = fake_claude_cache(tmp_path)
    h = make_harness(HarnessConfig(name="claude_code", npm_cache_dir=str(prefix.parent)), npm="/bin/false")
    native = prefix / "node_modules" / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
    spec = SandboxSpec(labels={"run_id": "shown"}, ro_binds=[str(prefix)])
    for first in (True, False):
        async with open_sandbox(sandbox_cfg, spec) as sb:
            stale = f"{h.scratch_dir(sb)}/stale.txt"
            await sb.write_files({stale: "a run before", f"{sb.root}/repo/.keep": ""})  # from outside: no command
            res = await h.run(sb, make_run(sb, gateway.base_url))
            assert res.end is HarnessEnd.FINISHED and res.final_message == f"ran from {native}", res.reason
            commands = [c.describe for c in sb.cpu.commands]
            assert len(commands) == (2 if first else 1), commands  # configure's, then the CLI's
            assert sb._jail_proven
            with pytest.raises(Exception):
                await sb.read_file(stale)  # a fresh scratch dir per configure, either way


async def test_upload_when_the_sandbox_cannot_see_the_cache(sandbox, gateway, tmp_path: Path) -> None:
    """A cache entry under /tmp is invisible inside a local sandbox (private /tmp), like the
    host cache from an E2B sandbox: the CLI's package is uploaded as a tarball and run."""
    pkg = pinned_package("claude_code")
    fake_claude_cache(tmp_path)
    h = make_harness(HarnessConfig(name="claude_code", npm_cache_dir=str(tmp_path / "npm-cache")), npm="/bin/false")
    await sandbox.exec(["mkdir", "-p", f"{sandbox.root}/repo"])
    res = await h.run(sandbox, make_run(sandbox, gateway.base_url))
    assert res.end is HarnessEnd.FINISHED, res.reason
    remote = f"{sandbox.root}/.farm/cli/{pkg.dirname}/node_modules/@anthropic-ai/claude-code-linux-x64/claude"
    assert res.final_message == f"ran from {remote}"
    assert list((tmp_path / "npm-cache").glob("*.tar.gz"))  # built once, reused next time



async def test_a_late_answer_within_the_probe_timeout_counts(sandbox) -> None:
    """A gateway slow to answer (a CPU-starved node) is reachable: the probe's attempt waits
    for the answer until its timeout, not 3 s and a new jail."""
    from farm.harnesses.probe import probe_gateway

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(3.5)  # a gateway slower than the probe's timeout
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(slow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await probe_gateway(sandbox, f"http://127.0.0.1:{port}", timeout_s=8) is None
    finally:
        server.close()
