"""LocalSandbox isolation, limits and lifecycle, on the real bubblewrap jail."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import tempfile
import sys
import uuid
from pathlib import Path

import pytest
from sandbox_testutil import host_pids_with

from farm.errors import SandboxError
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalLimits, LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.local import LocalSandbox, sandbox_pids
from testkit.waits import async_wait_until


def _cfg(base: SandboxConfig, **local: object) -> SandboxConfig:
    return base.model_copy(update={"local": base.local.model_copy(update=local)})


async def test_cannot_write_outside_workspace(local_cfg: SandboxConfig) -> None:
    host_tmp_file = Path(f"/tmp/farm-escape-{uuid.uuid4().hex}")
    home_file = Path.home() / f"farm-escape-{uuid.uuid4().hex}"
    async with await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "iso"})) as sb:
        res = await sb.exec(f"echo x > {host_tmp_file}; echo rc=$?; echo x > {home_file}; echo rc=$?; touch /usr/x")
        assert "rc=0" in res.stdout.splitlines()[0]  # /tmp is the sandbox's own
        assert res.stdout.splitlines()[1] == "rc=1" and "Read-only file system" in res.stderr
        assert not host_tmp_file.exists() and not home_file.exists() and not Path("/usr/x").exists()
        # the sandbox's own root and HOME are writable
        assert (await sb.exec('touch "$HOME/ok" ./ok2')).ok
        assert Path(sb.home, "ok").exists()
        # file calls refuse paths (and symlinks) that lead outside
        await sb.exec("ln -s /etc/passwd passwd-link; ln -s /root root-link")
        with pytest.raises(SandboxError, match="outside"):
            await sb.read_file("passwd-link")
        with pytest.raises(SandboxError, match="outside"):
            await sb.write_file("root-link/evil", "x")
        with pytest.raises(SandboxError, match="outside"):
            await sb.write_file("/etc/evil", "x")
        assert not (Path("/root") / "evil").exists()


async def test_writing_a_directory_anew_removes_what_is_there_and_follows_no_link(local_cfg: SandboxConfig) -> None:
    """``write_files_anew``: the directory's old content gone, the new files in; a symlink in
    its place is removed itself, never what it points to; the sandbox's own areas are kept."""
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        await sb.write_files({"/tmp/d/old.txt": "old", "/tmp/d/sub/deep.txt": "old", "keep/kept.txt": "kept"})
        # a read-only directory the sandbox made there (farm as root removes it anyway: the
        # chmod that lets a non-root farm remove it is exercised only off root)
        assert (await sb.exec("mkdir -p /tmp/d/ro/in && touch /tmp/d/ro/in/f && chmod 0500 /tmp/d/ro/in /tmp/d/ro")).ok
        await sb.write_files_anew("/tmp/d", {"/tmp/d/new.txt": "new"})
        assert (await sb.exec("find /tmp/d | sort")).stdout.split() == ["/tmp/d", "/tmp/d/new.txt"]
        await sb.exec(f"rm -r /tmp/d && ln -s {sb.root}/keep /tmp/d")
        await sb.write_files_anew("/tmp/d", {"/tmp/d/new.txt": "new"})
        assert (await sb.read_file("keep/kept.txt")) == b"kept"  # the link's target is untouched
        assert (await sb.exec("test -d /tmp/d && ! test -L /tmp/d && cat /tmp/d/new.txt")).stdout == "new"
        for area in (sb.root, "/tmp", sb.tmp, "..", "."):  # refused, or (a root under the host's /tmp) not the root
            with contextlib.suppress(SandboxError):
                await sb.write_files_anew(area, {})
        with pytest.raises(SandboxError, match="not a directory to remove"):
            await sb.write_files_anew("..", {})
        assert (await sb.read_file("keep/kept.txt")) == b"kept" and (await sb.read_file("/tmp/d/new.txt")) == b"new"


async def test_cannot_see_other_sandboxes(local_cfg: SandboxConfig) -> None:
    async with (
        await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "iso"})) as a,
        await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "iso"})) as b,
    ):
        await a.write_file("secret.txt", "a's")
        await a.exec("echo a-tmp > /tmp/a-tmp")
        res = await b.exec(f"cat {a.root}/secret.txt; ls {Path(a.root).parent.parent}; cat /tmp/a-tmp")
        assert "a's" not in res.stdout and "a-tmp" not in res.stdout
        assert res.exit_code != 0
        # nor the host's /tmp (only its own), nor host environment variables
        assert "farm-sandboxes" not in (await b.exec("ls /tmp")).stdout.replace(Path(local_cfg.local.base_dir).name, "")


async def test_host_env_does_not_leak(local_cfg: SandboxConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FARM_TEST_SECRET", "hunter2")
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        assert "hunter2" not in (await sb.exec("env")).stdout


async def test_no_process_left_after_close(local_cfg: SandboxConfig) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 4 * 10**6}"
    sb = await create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "iso"}))
    await sb.start(f"sleep {marker} & (setsid nohup sleep {marker} >/dev/null 2>&1 &); sleep {marker}")
    await async_wait_until(lambda: len(host_pids_with(f"sleep {marker}")) >= 3, what="its three sleeps running")
    assert sandbox_pids(sb.id)
    await sb.close()
    await async_wait_until(lambda: not host_pids_with(f"sleep {marker}"), timeout_s=10, what="no process left")
    assert sandbox_pids(sb.id) == []
    assert not Path(sb.root).exists()


async def test_exec_leaves_no_daemon_behind(local_cfg: SandboxConfig) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 5 * 10**6}"
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        res = await sb.exec(f"(setsid nohup sleep {marker} >/dev/null 2>&1 &); echo started")
        assert res.stdout == "started\n"
        await async_wait_until(lambda: not host_pids_with(f"sleep {marker}"), timeout_s=10, what="no process left")


async def test_own_pid_namespace_and_no_capabilities(local_cfg: SandboxConfig) -> None:
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        res = await sb.exec("echo $$; grep CapEff /proc/self/status; hostname")
        pid, caps, host = res.stdout.split("\n")[:3]
        assert int(pid) < 10  # bwrap's init is pid 1 in the sandbox's namespace
        assert caps.split()[1] == "0000000000000000"
        assert host == "farm-sandbox"
        assert (await sb.exec(["id", "-u"], user="nobody")).stdout == "65534\n"


async def test_loopback_reaches_host_server(local_cfg: SandboxConfig) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello from host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = f"exec 3<>/dev/tcp/127.0.0.1/{port} && head -1 <&3"
    try:
        # setup (before the latch) uses the host network by default: package installs work
        async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
            assert (await sb.exec(probe, timeout=30)).stdout == "hello from host\n"
            await sb.isolate_network()  # the agent's commands: own loopback only
            assert (await sb.exec(probe, timeout=30)).exit_code != 0
            assert sb.network_policy == {"setup": "host", "agent": "isolated", "forwarded_ports": ""}
        async with await create_sandbox(_cfg(local_cfg, setup_network="isolated"), SandboxSpec()) as sb:
            assert (await sb.exec(probe, timeout=30)).exit_code != 0
        # 'host' (the explicit opt-out) keeps the host network after the latch too
        async with await create_sandbox(_cfg(local_cfg, network="host"), SandboxSpec()) as sb:
            await sb.isolate_network()
            assert (await sb.exec(probe, timeout=30)).stdout == "hello from host\n"
            assert await sb.forward_port(port) is None
    finally:
        server.close()
        await server.wait_closed()


async def test_rlimits_applied_and_enforced(local_cfg: SandboxConfig) -> None:
    limits = LocalLimits(memory_bytes=512 * 1024**2, nofile=256, nproc=100, file_size_bytes=2 * 1024**2)
    async with await create_sandbox(_cfg(local_cfg, limits=limits), SandboxSpec()) as sb:
        res = await sb.exec("ulimit -n; ulimit -u; ulimit -f; ulimit -c")
        assert res.stdout.split() == ["256", "100", str(2 * 1024), "0"]
        # a bash script sets them with bash's ulimit, any other command runs under prlimit:
        # the same limits either way, soft and hard
        show = "import resource as r; print([r.getrlimit(getattr(r, 'RLIMIT_' + n)) for n in ('NOFILE', 'NPROC', 'FSIZE', 'CORE')])"
        want = f"{[(256, 256), (100, 100), (2 << 20, 2 << 20), (0, 0)]}\n"
        assert (await sb.exec(["python3", "-c", show])).stdout == want
        assert (await sb.exec(f"python3 -c {shlex.quote(show)}")).stdout == want
        # memory is the whole sandbox's (cgroup), not a per-process RLIMIT_DATA
        assert (await sb.exec("ulimit -d")).stdout.strip() == "unlimited"
        assert (await sb.exec(["node", "-e", "console.log(6*7)"])).stdout == "42\n"
        # open files and file size
        files = await sb.exec(["python3", "-c", "import os; [os.open('/dev/null', os.O_RDONLY) for _ in range(400)]"])
        assert files.exit_code != 0 and "Too many open files" in files.stderr
        fsize = await sb.exec("head -c 3000000 /dev/zero > big.bin")
        assert fsize.exit_code != 0


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
async def test_rlimit_nproc_stops_fork_bomb_when_not_root() -> None:
    """RLIMIT_NPROC is per command tree (own user namespace) for a non-root farm. The
    kernel exempts real root from it, so as root we run the same jail via setpriv."""
    with tempfile.TemporaryDirectory(prefix="farm-nproc-") as top:
        os.chmod(top, 0o755)  # reachable by the unprivileged uid
        await _fork_bomb_in_jail(Path(top))


FORK_40 = """
import os, time
n = 0
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print(n)
"""


async def _fork_bomb_in_jail(tmp_path: Path) -> None:
    from farm.sandboxes.bwrap import HostMounts, bwrap_argv, prlimit_prefix
    from farm.sandboxes.hostview import user_files

    root = tmp_path / "root"
    tmp = tmp_path / "tmp"
    etc = tmp_path / "etc"
    for d in (root, tmp, etc):
        d.mkdir()
        os.chown(d, 65534, 65534)
    for name, text in zip(("passwd", "group"), user_files(65534, str(root))):
        (etc / name).write_text(text)
    argv = bwrap_argv(
        bwrap=shutil.which("bwrap") or "bwrap",
        root=str(root),
        tmp_dir=str(tmp),
        host=HostMounts.of(str(etc), []),
        sock_dir=None,
        cwd=str(root),
        env={"PATH": "/usr/bin:/bin"},
        argv=[*prlimit_prefix(shutil.which("prlimit") or "prlimit", LocalLimits(nproc=20), memory_per_process=True),
              "python3", "-c", FORK_40],
        uid=None,
        unshare_user=True,
        unshare_net=False,
    )
    if os.getuid() == 0:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    assert int(out.strip()) < 20


async def test_cpu_limit_kills_spinner(local_cfg: SandboxConfig) -> None:
    async with await create_sandbox(_cfg(local_cfg, limits=LocalLimits(cpu_seconds=1)), SandboxSpec()) as sb:
        res = await sb.exec(["python3", "-c", "while True: pass"], timeout=60)
        assert res.exit_code != 0  # SIGXCPU


async def test_output_is_capped(local_cfg: SandboxConfig) -> None:
    cfg = local_cfg.model_copy(update={"max_output_bytes": 4096})
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        res = await sb.exec("printf START; head -c 5000000 /dev/zero | tr '\\0' x; printf END")
        assert res.truncated and res.exit_code == 0
        assert res.stdout.startswith("STARTxx") and res.stdout.endswith("xxEND")
        assert len(res.stdout) < 4096 + 100 and "bytes truncated" in res.stdout
        small = await sb.exec("echo small")
        assert not small.truncated and small.stdout == "small\n"


async def test_sixteen_concurrent_sandboxes(local_cfg: SandboxConfig) -> None:
    sbs = await asyncio.gather(
        *(create_sandbox(local_cfg, SandboxSpec(labels={"run_id": "many", "rollout_id": str(i)})) for i in range(16))
    )
    try:
        assert len({sb.id for sb in sbs}) == 16

        async def work(sb: LocalSandbox) -> str:
            await sb.write_file("id.txt", sb.labels["rollout_id"])
            res = await sb.exec("sleep 0.5; cat id.txt; echo; echo $FARM_SANDBOX_ID", timeout=120)
            return res.stdout

        outs = await asyncio.gather(*(work(sb) for sb in sbs))
        assert [o.split() for o in outs] == [[str(i), sb.id] for i, sb in enumerate(sbs)]
    finally:
        await asyncio.gather(*(sb.close() for sb in sbs))
    assert not any(Path(sb.root).exists() for sb in sbs)


async def test_keep_leaves_workspace(local_cfg: SandboxConfig) -> None:
    async with await create_sandbox(_cfg(local_cfg, keep=True), SandboxSpec(labels={"run_id": "k"})) as sb:
        await sb.write_file("kept.txt", "yes")
    assert Path(sb.root, "kept.txt").read_text() == "yes"


async def test_missing_bwrap_is_a_clear_error(local_cfg: SandboxConfig) -> None:
    with pytest.raises(SandboxError, match="apt-get install bubblewrap"):
        await create_sandbox(_cfg(local_cfg, bwrap_path="/nonexistent/bwrap"), SandboxSpec())


async def test_the_first_command_proves_the_jail(local_cfg: SandboxConfig) -> None:
    """No `true` runs at create: the first command's bwrap status says the jail was made. A
    jail that cannot be made (here its root bind's source is gone) is the sandbox's error,
    not the command's exit 1; a first command that fails in its own part of the jail (a cwd
    that is not there) or by itself is its result, and the jail is proven by a `true`."""
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        assert not list(sb.cpu.commands)  # no probe ran
        shutil.rmtree(sb.root)
        with pytest.raises(SandboxError, match="local sandbox cannot run commands .*Can't find source path"):
            await sb.exec("echo hi")
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        res = await sb.exec("echo hi", cwd="no/such/dir")
        assert res.exit_code == 1 and "chdir" in res.stderr and sb._jail_proven
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        res = await sb.exec("exit 1")
        assert res.exit_code == 1 and sb._jail_proven
        assert (await sb.exec("echo hi")).stdout == "hi\n"


async def test_a_started_first_command_proves_the_jail_when_it_ends(local_cfg: SandboxConfig) -> None:
    """``start`` runs no `true` before a first command either: its jail's status is read when
    it ends by itself, and a jail that was not made is the sandbox's error from ``wait``. A
    kill says nothing of the jail: the next command proves it."""
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        proc = await sb.start("echo hi")
        res = await proc.wait(30)
        assert res.stdout == "hi\n" and sb._jail_proven and len(list(sb.cpu.commands)) == 1
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        shutil.rmtree(sb.root)
        proc = await sb.start("echo hi")
        with pytest.raises(SandboxError, match="local sandbox cannot run commands .*Can't find source path"):
            await proc.wait(30)
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        proc = await sb.start("sleep 600")
        await proc.kill()
        assert not sb._jail_proven
        # killed before bwrap forked its init: bwrap's own -9; after: the init's SIGKILL as bwrap reports it
        assert (await proc.wait(30)).exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL) and not sb._jail_proven
        assert (await sb.exec("echo hi")).stdout == "hi\n" and sb._jail_proven


async def test_isolation_none_is_explicit_and_warns(
    local_cfg: SandboxConfig, caplog: pytest.LogCaptureFixture
) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 6 * 10**6}"
    with caplog.at_level(logging.WARNING, logger="farm.sandboxes.local"):
        async with await create_sandbox(_cfg(local_cfg, isolation="none"), SandboxSpec()) as sb:
            assert "WITHOUT isolation" in caplog.text
            res = await sb.exec('echo "$HOME"; pwd')
            assert res.stdout.split() == [sb.home, sb.root]
            with pytest.raises(Exception, match="timeout"):
                await sb.exec(f"sleep {marker} & sleep {marker}", timeout=0.5)
            assert await _gone(f"sleep {marker}")
            # a background job left in the command's process group dies with the command
            # (SIGKILL is sent before exec returns; the kernel may take a moment to reap it)
            await sb.exec(f"sleep {marker} >/dev/null 2>&1 &")
            assert await _gone(f"sleep {marker}")


async def _gone(pattern: str, wait_s: float = 5.0) -> bool:
    for _ in range(int(wait_s / 0.1)):
        if not host_pids_with(pattern):
            return True
        await asyncio.sleep(0.1)  # poll: wait_s bounds the wait
    return host_pids_with(pattern) == []


async def test_ro_binds_expose_hidden_host_paths(local_cfg: SandboxConfig, tmp_path: Path) -> None:
    shared = tmp_path / "npm-cache"  # under /tmp: hidden unless bound
    shared.mkdir()
    (shared / "pkg.txt").write_text("cached")
    cfg = _cfg(local_cfg, ro_binds=[str(shared), str(tmp_path / "does-not-exist")])
    async with await create_sandbox(cfg, SandboxSpec()) as sb:
        res = await sb.exec(f"cat {shared}/pkg.txt; touch {shared}/new")
        assert res.stdout == "cached" and "Read-only" in res.stderr
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        assert (await sb.exec(f"cat {shared}/pkg.txt")).exit_code != 0


async def test_farms_own_python_env_stays_visible_when_under_tmp(
    local_cfg: SandboxConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A farm venv under /tmp (a CI clone) is bound read-only, or tasks' pytest would vanish."""
    venv = tmp_path / "clone" / ".venv"  # under /tmp: the sandbox's private /tmp hides it
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "marker").write_text("venv")
    (tmp_path / "clone" / "secret.txt").write_text("not for the sandbox")
    monkeypatch.setattr(sys, "prefix", str(venv))
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        res = await sb.exec(f"cat {venv}/bin/marker; touch {venv}/bin/new")
        assert res.stdout == "venv" and "Read-only" in res.stderr
        assert (await sb.exec(f"cat {tmp_path}/clone/secret.txt")).exit_code != 0  # only the venv itself


def test_local_sandbox_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError):
        LocalSandboxConfig.model_validate({"isolation": "bwrap", "bogus": 1})


async def test_kill_reaps_the_jail_without_orphaning_zombies(local_cfg: SandboxConfig) -> None:
    from farm.sandboxes.process import child_pids

    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        proc = await sb.start("sleep 1000")
        for _ in range(50):
            inner = child_pids(proc.pid)  # bwrap's namespace init
            if inner:
                break
            await asyncio.sleep(0.05)  # poll: 50 tries bound the wait
        assert inner
        await proc.kill()
        # reaped by the outer bwrap, not left as a zombie for PID 1
        assert [p for p in inner if os.path.exists(f"/proc/{p}")] == []


async def test_the_host_view_is_worked_out_once_per_sandbox(local_cfg: SandboxConfig,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command's jail shows the same host; resolving it (~40 stats and realpaths) is
    done at the sandbox's first command, not at each."""
    from farm.sandboxes import bwrap

    calls = []
    real = bwrap.HostMounts.of.__func__
    monkeypatch.setattr(bwrap.HostMounts, "of", classmethod(lambda cls, *a: calls.append(a) or real(cls, *a)))
    async with await create_sandbox(local_cfg, SandboxSpec()) as sb:
        for _ in range(3):
            res = await sb.exec(["cat", "/etc/hosts"], timeout=60)
            assert res.exit_code == 0, res.stderr
    assert len(calls) == 1
