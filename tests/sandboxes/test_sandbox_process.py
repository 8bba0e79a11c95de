"""HostProcess: a command's exit is seen at exit, even when a leftover process it
started still holds its output pipes (asyncio's Process.wait() alone would wait for
those pipes to close: a hang as long as the leftover lives)."""

from __future__ import annotations

import asyncio
import time

from farm.sandboxes.process import HostProcess
from testkit.waits import async_wait_until


async def test_exit_is_seen_while_a_leftover_holds_the_pipes():
    proc = await HostProcess.spawn(
        ["bash", "-c", "sleep 60 & echo started"], env={"PATH": "/usr/bin:/bin"}, cwd=None,
        describe="leftover", max_output_bytes=1 << 16, kill_grace_s=5.0,
    )  # fmt: skip
    t0 = time.monotonic()
    result = await asyncio.wait_for(proc.wait(timeout=120), 30)
    assert result.exit_code == 0 and "started" in result.stdout
    assert time.monotonic() - t0 < 15, "waited for the leftover's pipes"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_leftover_in_the_commands_group_is_killed_when_its_result_is_collected():
    """The command's own group outlives its leader: what is left in it is killed (found by
    signal 0 to the group, not a scan of /proc); an emptied group is no error."""
    proc = await HostProcess.spawn(
        ["bash", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], env={"PATH": "/usr/bin:/bin"}, cwd=None,
        describe="leftover", max_output_bytes=1 << 16, kill_grace_s=5.0,
    )  # fmt: skip
    result = await asyncio.wait_for(proc.wait(timeout=60), 30)
    leftover = int(result.stdout.split()[0])
    await async_wait_until(lambda: not _alive(leftover), timeout_s=10,
                           what="the leftover of the command's group gone")  # fmt: skip
    await proc.kill()  # idempotent on an emptied group


async def test_busy_processes_count_the_agents_tools_not_farms_own(local_cfg):
    """What ``rollout.agent_idle_timeout_s`` reads: a started command alone (the CLI) and
    farm's jail and port relay are not work; a process it starts (a tool) is."""
    from farm.sandboxes.base import SandboxSpec
    from farm.sandboxes.factory import create_sandbox

    sb = await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "busy"}))
    try:
        await sb.isolate_network()
        await sb.forward_port(45678)  # a socat relay in every later command's jail
        cli = await sb.start("sleep 30")  # the CLI waiting (for the model)
        await asyncio.sleep(1.0)
        assert await asyncio.to_thread(sb.busy_processes) == 0
        tool = await sb.start("bash -c 'sleep 30; true'")  # a CLI running a tool
        await asyncio.sleep(1.0)
        assert await asyncio.to_thread(sb.busy_processes) == 1
        await tool.kill()
        await cli.kill()
    finally:
        await sb.close()


async def test_a_session_is_idle_only_without_a_request_in_flight():
    from farm.gateway.sessions import SessionTable

    session = SessionTable().open("s", model_name="m", max_turns=5, max_context_tokens=100)
    gate = asyncio.Event()
    task = asyncio.ensure_future(gate.wait())
    session.track(task)
    await asyncio.sleep(0.2)  # the clock passes while a turn is in flight: not idle
    assert session.idle_s() == 0.0
    gate.set()
    await task
    await asyncio.sleep(0.2)  # the clock passes with no turn in flight: idle that long
    assert 0.15 < session.idle_s() < 5


async def test_a_commands_exit_is_heard_on_the_loop_not_by_a_thread_per_command():
    """farm.sandboxes.childwatch: on 3.11 asyncio's default would start a ``waitpid`` thread
    per command; farm's commands are watched by a pidfd on whichever loop started them (here
    one loop in this thread, one in another), and their exit codes and signals are exact."""
    import sys
    import threading

    async def one(argv: list[str]) -> tuple[int | None, set[str]]:
        proc = await HostProcess.spawn(argv, env={"PATH": "/usr/bin:/bin"}, cwd=None, describe="watched",
                                       max_output_bytes=1 << 16, kill_grace_s=5.0)  # fmt: skip
        waiters = {t.name for t in threading.enumerate() if "waitpid" in t.name}
        return (await asyncio.wait_for(proc.wait(timeout=60), 30)).exit_code, waiters

    code, waiters = await one(["sh", "-c", "sleep 0.3; exit 7"])
    assert code == 7
    if sys.version_info < (3, 12):
        assert not waiters, f"a thread per command: {waiters}"
    killed, _ = await one(["sh", "-c", "kill -9 $$"])
    assert killed == -9
    other: list = []
    thread = threading.Thread(target=lambda: other.append(asyncio.run(one(["sh", "-c", "exit 3"]))))
    thread.start()
    await asyncio.to_thread(thread.join, 30)
    assert other and other[0][0] == 3
