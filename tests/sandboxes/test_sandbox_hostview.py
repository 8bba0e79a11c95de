"""What a local sandbox can see and reach, with the default config, on the real jail:
a minimal host, an unprivileged uid, no network but its one forwarded port, and limits
(memory, pids, disk, lifetime) that hold per sandbox and are recorded as breaches."""

from __future__ import annotations

import asyncio
import os
import shlex
import socket
import sys
from pathlib import Path

import pytest

import farm
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalLimits, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.local import reap
from testkit.waits import async_wait_until


def _cfg(base: SandboxConfig, **local: object) -> SandboxConfig:
    return base.model_copy(update={"local": base.local.model_copy(update=local)})


async def test_minimal_host_view(local_cfg: SandboxConfig, tmp_path: Path) -> None:
    ray_home = Path.home() / ".ray"
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text('{"gold_patch": "the answer"}\n')
    project = Path(farm.__file__).resolve().parent / "tasks" / "demo" / "build.py"
    async with (
        await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "view"})) as a,
        await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "view"})) as b,
    ):
        await b.write_file("b-secret.txt", "b's")
        hidden = [str(task_file), str(project), str(ray_home), "/tmp/ray", "/home", "/var/lib",
                  "/etc/shadow", "/sys/fs/cgroup", f"{b.root}/b-secret.txt", str(b.dir)]
        res = await a.exec("; ".join(f"test -e {shlex.quote(p)} && echo SEEN {shlex.quote(p)}" for p in hidden) + "; true")
        assert res.stdout == "", res.stdout
        # its own root is bound at the same path as on the host: of the run dir, it sees itself only
        assert (await a.exec(f"ls -A {a.dir.parent}")).stdout.split() == [a.id]
        assert (await a.exec("ls -A /root")).stdout.split() in ([], [".pyenv"])  # only farm's own Python, if there
        # ... while the runtime a coding agent needs is there
        ok = await a.exec("id -u; id -un; git --version >/dev/null && node -e '' "
                          f"&& {shlex.quote(sys.executable)} -c 'import pytest' && echo tools-ok; cat /etc/passwd")
        uid, name, tools, *passwd = ok.stdout.splitlines()
        assert (uid, name, tools) == ("1000", "sandbox", "tools-ok"), ok
        assert all(line.split(":")[0] in {"root", "sandbox", "nobody"} for line in passwd)
        # nothing outside root, /tmp and /run is writable
        for path in ("/etc/x", "/usr/x", "/x", "/root/x", "/var/x"):
            assert (await a.exec(f"touch {path}")).exit_code != 0, path


async def test_spec_ro_binds_show_a_host_dir_read_only(local_cfg: SandboxConfig, tmp_path: Path) -> None:
    cli = tmp_path / "cli-prefix"
    cli.mkdir()
    (cli / "tool.sh").write_text("echo cli-ran\n")
    async with await create_sandbox(local_cfg, SandboxSpec(ro_binds=[str(cli)])) as sb:
        assert (await sb.exec(f"sh {cli}/tool.sh")).stdout == "cli-ran\n"
        assert (await sb.exec(f"touch {cli}/x")).exit_code != 0
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        assert (await sb.exec(f"test -e {cli}")).exit_code != 0


async def test_network_latch_and_one_forwarded_port(local_cfg: SandboxConfig, tmp_path: Path) -> None:
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    host_port = tcp.getsockname()[1]  # e.g. Ray's GCS on loopback
    connect = "timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{}' && echo REACHED"
    served = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(await reader.readline())
        writer.write(b"from the unix socket\n")
        await writer.drain()
        writer.close()

    try:
        async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
            assert (await sb.exec(connect.format(host_port))).stdout == "REACHED\n"  # setup: host network
            await sb.isolate_network()
            assert (await sb.exec(connect.format(host_port))).stdout == ""
            path = await sb.forward_port(host_port + 1 if host_port < 65535 else host_port - 1)
            assert path is not None and len(path) < 100
            server = await asyncio.start_unix_server(handle, path)
            port = int(path.rsplit("-", 1)[1].split(".")[0])
            res = await sb.exec(f"exec 3<>/dev/tcp/127.0.0.1/{port}; echo hi >&3; head -1 <&3")
            assert res.stdout == "from the unix socket\n" and served == [b"hi\n"]
            # only loopback exists: no route anywhere, and the socket dir is not writable
            assert (await sb.exec("tail -n +2 /proc/net/route")).stdout == ""
            assert (await sb.exec("touch /run/farm/x")).exit_code != 0
            assert sb.network_policy["agent"] == "isolated" and sb.network_policy["forwarded_ports"] == str(port)
            listening = f"grep -c ' 0100007F:{port:04X} 00000000:0000 0A' /proc/net/tcp"
            assert (await sb.exec(listening)).stdout == "1\n"
            # the socket gone (the gateway unlinks a closed session's): no relay is started for it
            server.close()
            os.unlink(path)
            assert (await sb.exec(listening)).stdout == "0\n"
            assert (await sb.exec(f"exec 3<>/dev/tcp/127.0.0.1/{port} || echo REFUSED")).stdout == "REFUSED\n"
    finally:
        tcp.close()


async def test_limits_hold_per_sandbox_and_are_recorded(local_cfg: SandboxConfig) -> None:
    limits = LocalLimits(memory_bytes=256 << 20, pids=64, disk_bytes=200 << 20, disk_check_s=0.3)
    cfg = _cfg(local_cfg, limits=limits)
    async with (
        await create_sandbox(cfg, SandboxSpec(labels={"run_id": "lim"})) as bad,
        await create_sandbox(cfg, SandboxSpec(labels={"run_id": "lim"})) as good,
    ):
        neighbour = asyncio.ensure_future(
            good.exec("for i in $(seq 25); do echo $i > n; sleep 0.2; done; cat n", timeout=120)
        )
        hog = await bad.exec("python3 -c \"x = b'x' * (600 << 20)\"; echo rc=$?", timeout=60)
        assert hog.stdout == "rc=137\n"
        await bad.exec("f(){ f | f & }; f; sleep 2", timeout=60)
        fill = await bad.exec("dd if=/dev/zero of=fill.bin bs=1M count=4096 status=none; echo rc=$?", timeout=120)
        assert fill.exit_code != 0 and "rc=0" not in fill.stdout
        reasons = " | ".join(bad.breaches)
        assert "memory: processes exceeded the 256 MiB limit" in reasons
        assert "pids: the 64-process limit was hit" in reasons
        assert "disk:" in reasons and "over the 200 MiB limit" in reasons
        result = await neighbour
        assert result.stdout == "25\n" and good.breaches == []


async def test_the_disk_is_summed_only_when_something_wrote(local_cfg: SandboxConfig) -> None:
    """An idle sandbox costs no walk, nor does a running command whose processes' write
    counts keep the use under the limit; what a command left (an allocation no write count
    shows) is summed after it ends; farm's own writes are summed too. (The rounds are driven
    by hand: the watchdog's own loop waits an hour here.)"""
    cfg = _cfg(local_cfg, limits=LocalLimits(disk_bytes=40 << 20, disk_check_s=3600, disk_full_check_s=3600))
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        dog = sb._watchdog
        assert (await sb.exec(["true"])).ok  # its jail proven: start() runs no probe first
        await dog.check()
        walks = dog.walks
        await dog.check()
        assert dog.walks == walks, "an idle sandbox was walked"
        proc = await sb.start("sleep 0.5; fallocate -l 60M big")
        await dog.check()  # while it runs: nothing written yet
        assert dog.walks == walks + (0 if sb._writes_counted else 1) and sb.breaches == []
        assert (await proc.wait(60)).exit_code == 0
        await dog.check()
        assert [b for b in sb.breaches if b.startswith("disk:")], "what the command wrote was not summed"
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        await sb._watchdog.check()
        await sb.write_file(f"{sb.root}/upload.bin", b"x" * (60 << 20))
        await sb._watchdog.check()
        assert [b for b in sb.breaches if b.startswith("disk:")], "farm's own write was not summed"


async def test_an_idle_sandbox_s_watchdog_does_not_wake(local_cfg: SandboxConfig) -> None:
    """A sandbox with no command running and nothing written runs no round at all (a warm pool
    of them costs no wake-ups); a command or farm's write brings the rounds back; its lifetime
    still ends while it idles."""
    cfg = _cfg(local_cfg, limits=LocalLimits(disk_bytes=40 << 20, disk_check_s=0.05))
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        dog = sb._watchdog
        await _until(lambda: dog.rounds >= 1 and dog._idle())  # the first round sums what create made
        rounds = dog.rounds
        await asyncio.sleep(0.6)  # a window of 12 disk_check_s in which an idle sandbox's watchdog must sleep
        assert dog.rounds == rounds, "an idle sandbox's watchdog woke"
        proc = await sb.start("sleep 0.5")
        await _until(lambda: dog.rounds >= rounds + 2)  # a busy sandbox: a round every disk_check_s
        await proc.wait(30)
        await _until(lambda: dog._idle())
        rounds = dog.rounds
        await sb.write_file(f"{sb.root}/f.txt", "x")
        await _until(lambda: dog.rounds > rounds)  # farm's write is summed
    async with await create_sandbox(cfg, SandboxSpec(timeout_s=1.5)) as sb:
        await _until(lambda: "lifetime" in sb._watchdog.breaches)
        assert "lifetime" in " ".join(sb.breaches)


async def _until(cond, timeout_s: float = 30.0) -> None:  # noqa: ANN001 - a predicate
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)  # poll: the loop's deadline bounds the wait


async def test_a_running_writer_is_stopped_by_its_write_counts_without_walks_below_the_limit(
    local_cfg: SandboxConfig,
) -> None:
    """While a command runs, the processes' write counts (a child's, once reaped, in its
    parent's) bound the use: writes under the limit cost no walk; writes over it make the
    round walk and stop the command while it still runs; an allocation no count shows is
    found by the walk every ``disk_full_check_s``."""
    cfg = _cfg(local_cfg, limits=LocalLimits(disk_bytes=40 << 20, disk_check_s=3600, disk_full_check_s=3600))
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        if not sb._writes_counted:
            pytest.skip("no cgroup or no disk file system here: every round walks")
        dog = sb._watchdog
        assert (await sb.exec(["true"])).ok  # its jail proven: start() runs no probe first
        await dog.check()
        walks = dog.walks
        small = await sb.start("sh -c 'dd if=/dev/zero of=small bs=1M count=10 status=none; touch done'; sleep 60")
        await _until(lambda: os.path.exists(f"{sb.root}/done"))
        await dog.check()
        assert dog.walks == walks and sb.breaches == [], "writes under the limit were walked"
        big = await sb.start("sh -c 'dd if=/dev/zero of=big bs=1M count=40 status=none; touch done2'; sleep 60")
        await _until(lambda: os.path.exists(f"{sb.root}/done2"))
        async def walked() -> bool:
            await dog.check()
            return dog.walks > walks

        # the inner sh, ended but not yet reaped, counts in neither itself nor its parent: a few rounds
        await async_wait_until(walked, timeout_s=5, interval_s=0.1, what="writes over the limit walked")
        assert dog.walks == walks + 1, "writes over the limit were not walked"
        assert [b for b in sb.breaches if b.startswith("disk:")], "writes over the limit were not stopped"
        assert (await big.wait(30)).exit_code != 0 and (await small.wait(30)).exit_code != 0
    cfg = _cfg(local_cfg, limits=LocalLimits(disk_bytes=40 << 20, disk_check_s=3600, disk_full_check_s=0.2))
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        dog = sb._watchdog
        assert (await sb.exec(["true"])).ok  # its jail proven: start() runs no probe first
        await dog.check()
        proc = await sb.start("fallocate -l 60M big && touch done; sleep 60")
        await _until(lambda: os.path.exists(f"{sb.root}/done"))
        await asyncio.sleep(0.3)  # the full walk's 0.2 s interval passes
        await dog.check()
        assert [b for b in sb.breaches if b.startswith("disk:")], "an allocation was not found by the full walk"
        assert (await proc.wait(30)).exit_code != 0


async def test_lifetime_is_enforced(local_cfg: SandboxConfig) -> None:
    cfg = _cfg(local_cfg, limits=LocalLimits(disk_check_s=0.2))
    async with await create_sandbox(cfg, SandboxSpec(timeout_s=1.0)) as sb:
        res = await sb.exec("sleep 30; echo survived", timeout=60)
        assert "survived" not in res.stdout
        assert sb.breaches == ["lifetime: 1 s exceeded: processes killed"]


async def test_reap_removes_the_sandbox_cgroups(local_cfg: SandboxConfig) -> None:
    sb = await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "cgreap"}))
    cgroups = [Path(p) for p in __import__("json").loads((sb.dir / "labels.json").read_text())["cgroups"]]
    if not cgroups:
        pytest.skip("no writable cgroup on this machine: limits fall back to rlimits")
    await sb.start("sleep 300")
    assert all(d.is_dir() for d in cgroups)
    sb._closed = True  # an actor that died without closing: only reap is left
    assert await reap("cgreap", cfg=local_cfg.local) == [sb.id]
    assert not any(d.exists() for d in cgroups)
    assert not os.path.exists(sb.dir) and not os.path.exists(sb._sock_dir)


def test_a_view_is_mounted_and_unmounted_without_forking_mount(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """As root, an overlay view is mounted and unmounted by the system calls: with the
    commands made to fail, the view still comes and goes (the commands stay the fallback)."""
    from farm.errors import SandboxError
    from farm.sandboxes import views

    if os.geteuid() != 0:
        pytest.skip("not root: views are mounted by the commands")
    layer = tmp_path / "layer"
    layer.mkdir()
    (layer / "f").write_text("below")

    def no_commands(argv: list[str], what: str, timeout: float = 600.0) -> None:
        raise SandboxError(f"{what}: a command was run ({argv[0]})")

    monkeypatch.setattr(views, "_run", no_commands)
    merged = views.mount_view([views.ViewLayer(path=str(layer))], tmp_path / "view", "overlay")
    (merged / "f").write_text("above")
    assert views.mounts_under(tmp_path / "view") == [str(merged)]
    assert (layer / "f").read_text() == "below" and (tmp_path / "view" / "upper" / "f").read_text() == "above"
    assert views.unmount_under(tmp_path / "view") == [str(merged)]
    assert views.mounts_under(tmp_path / "view") == []


async def test_a_sandbox_is_made_while_its_runs_last_other_sandbox_removes_the_run_dir(local_cfg: SandboxConfig,
                                                                                        monkeypatch) -> None:
    """A sandbox closing removes its run's directory once it is empty; one being made in that
    run at that moment finds its parent gone between making it and making its own directory
    (``farm validate-tasks`` met it: a system error on a valid task). It makes the parent again."""
    import shutil
    from pathlib import Path

    real_mkdir = Path.mkdir
    removed: list[str] = []

    def mkdir(self: Path, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - Path.mkdir's
        if self.parent.name == "race" and not removed:
            removed.append(str(self.parent))
            shutil.rmtree(self.parent)  # the other sandbox's close, just after this one made the run dir
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    async with await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "race"})) as sb:
        assert removed and (await sb.exec(["true"])).ok
