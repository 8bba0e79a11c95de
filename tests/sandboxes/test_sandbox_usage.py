"""A local sandbox's CPU count (farm.sandboxes.usage): its cgroup's total, per command."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.local import LocalSandbox
from farm.sandboxes.usage import CPUBook

BUSY = "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done"  # ~0.5-1 s of CPU in sh, whatever the load


def counts_here(sb: LocalSandbox) -> bool:
    """Whether this machine's cgroups count the sandbox's CPU: v2 always, v1 with cpuacct.
    Skips where no cgroup is writable at all (the sandbox then says so in limits_policy)."""
    enforced = sb.limits_policy["enforced_by"]
    if not enforced.startswith("cgroup"):
        pytest.skip(f"no writable cgroup here ({enforced})")
    return enforced == "cgroup v2" or Path("/sys/fs/cgroup/cpuacct/cgroup.procs").exists()


class Counter:
    def __init__(self) -> None:
        self.value = 0.0

    def __call__(self) -> float:
        return self.value


def test_a_command_alone_gets_what_the_count_grew_by_and_overlaps_are_marked() -> None:
    c = Counter()
    book = CPUBook(c)
    book.started(101, "a")
    c.value = 2.0
    book.ended(101)
    book.started(102, "b")
    c.value = 2.5
    book.started(103, "c")  # b and c run together
    assert [k for k, _, _ in book.running()] == [2, 3]
    assert [pid for _, _, pid in book.running()] == [102, 103]
    c.value = 3.5
    book.ended(103)
    book.ended(102)
    book.started(104, "d")  # alone again
    c.value = 3.75
    book.ended(104)
    got = {x.describe: (x.key, x.cpu_s, x.alone) for x in book.commands}
    assert got == {"a": (1, 2.0, True), "b": (2, 1.5, False), "c": (3, 1.0, False), "d": (4, 0.25, True)}
    assert book.total_s() == 3.75
    book.freeze()
    c.value = 99.0
    assert book.total_s() == 3.75  # the cgroup is gone: the count as it was at close


def test_a_command_counts_from_the_reading_before_its_spawn() -> None:
    c = Counter()
    book = CPUBook(c)
    at = book.reading()
    c.value = 0.25  # the jail's start, while the spawn returned
    book.started(7, "a", at=at)
    c.value = 1.0
    book.ended(7)
    assert [(x.describe, x.cpu_s) for x in book.commands] == [("a", 1.0)]


async def test_a_real_sandbox_reads_its_count_before_each_spawn(local_cfg: SandboxConfig, monkeypatch) -> None:
    import farm.sandboxes.local as local_mod

    sb = await LocalSandbox.create(local_cfg.local, SandboxSpec(labels={"run_id": "usage"}))
    try:
        if not counts_here(sb):
            pytest.skip("cgroup v1 without cpuacct: the CPU is not counted")
        order: list[str] = []
        real_read, real_spawn = sb.cpu._read, local_mod.HostProcess.spawn
        sb.cpu._read = lambda: (order.append("read"), real_read())[1]

        async def spawn(*a, **kw):
            order.append("spawn")
            return await real_spawn(*a, **kw)

        monkeypatch.setattr(local_mod.HostProcess, "spawn", spawn)
        assert (await sb.exec(["true"])).exit_code == 0
        assert order[:2] == ["read", "spawn"] and order.count("read") == 2  # before the spawn, and at its end
    finally:
        await sb.close()


def test_no_count_no_figures() -> None:
    book = CPUBook(None)
    book.started(1, "a")
    book.ended(1)
    assert not book.counted and book.total_s() is None and not book.commands and not book.running()


async def test_a_real_sandbox_counts_its_commands_cpu(local_cfg: SandboxConfig) -> None:
    sb = await LocalSandbox.create(local_cfg.local, SandboxSpec(labels={"run_id": "usage"}))
    try:
        if not counts_here(sb):
            pytest.skip("cgroup v1 without cpuacct: the CPU is not counted")
        assert sb.cpu.counted
        assert (await sb.exec(["true"])).exit_code == 0  # a jail's start (and its proof: exec)
        assert (await sb.exec(BUSY)).exit_code == 0
        bg = await sb.start(["sleep", "1"])
        assert (await sb.exec(["true"])).exit_code == 0  # beside the sleep
        await bg.wait(30)
        probe, busy, true, sleep = list(sb.cpu.commands)
        assert probe.describe == "true" and probe.alone and probe.key == 1
        assert busy.describe == BUSY and busy.alone
        assert busy.cpu_s > 0.2 and busy.cpu_s > 5 * probe.cpu_s  # the loop's CPU, not only its jail's
        assert not true.alone and not sleep.alone
        total = sb.cpu.total_s()
        assert total >= probe.cpu_s + busy.cpu_s
    finally:
        await sb.close()
    assert sb.cpu.total_s() >= total  # kept after the cgroup went


async def test_the_count_includes_processes_the_command_left_to_others(local_cfg: SandboxConfig) -> None:
    """A forked child that outlives its parent is reparented inside the jail; its CPU is the
    sandbox's all the same (what rusage of farm's own children would miss)."""
    sb = await LocalSandbox.create(local_cfg.local, SandboxSpec(labels={"run_id": "usage"}))
    try:
        if not counts_here(sb):
            pytest.skip("cgroup v1 without cpuacct: the CPU is not counted")
        before = sb.cpu.total_s()
        res = await sb.exec(f"( {BUSY} ) & sleep 0.01; wait", timeout=120)
        assert res.exit_code == 0
        assert sb.cpu.total_s() - before > 0.2
    finally:
        await sb.close()


async def test_running_commands_are_listed_with_their_host_pid(local_cfg: SandboxConfig) -> None:
    sb = await LocalSandbox.create(local_cfg.local, SandboxSpec(labels={"run_id": "usage"}))
    try:
        if not counts_here(sb):
            pytest.skip("cgroup v1 without cpuacct: the CPU is not counted")
        proc = await sb.start(["sleep", "5"])
        (key, describe, pid), = sb.cpu.running()
        assert describe == "sleep 5" and pid == proc.pid and key == 1  # its first command: no `true` before it
        await proc.kill()
        await asyncio.sleep(0)
        assert sb.cpu.running() == []
    finally:
        await sb.close()
