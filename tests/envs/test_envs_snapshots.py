"""Environment snapshots with real sandboxes: built once per key, frozen, private
copy-on-write views, failures recorded once, crashes never leave a usable half-build,
reap and gc. Tasks here need no network: empty workspaces, setup writing files."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from farm.envs.config import EnvsConfig
from farm.envs.identity import identity_of
from farm.envs.provider import EnvBuildFailed, EnvProvider
from farm.envs.store import EnvStore
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.local import reap
from farm.sandboxes.views import mounts_under
from farm.sandboxes.watchdog import disk_usage
from farm.tasks.config import TasksConfig
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import prepare_workspace
from testkit.waits import async_wait_until

SETUP = [
    "echo ran >> setup-runs.log",
    "mkdir -p .venv/bin && head -c 4000000 /dev/urandom > .venv/blob && echo .venv/ >> .git/info/exclude",
    "echo base > f.txt",
]


def task(tid: str = "t1", setup: list[str] | None = None, **kw) -> Task:
    return Task(id=tid, instruction=f"do {tid}", setup_commands=SETUP if setup is None else setup,
                verify_commands=["true"], **kw)  # fmt: skip


@pytest.fixture
def world(tmp_path: Path):
    sb = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb")))
    envs = EnvsConfig(cache_dir=str(tmp_path / "envs"))
    made: list[SandboxSpec] = []

    def provider() -> EnvProvider:
        runtime = TaskRuntime.from_config(TasksConfig(cache_dir=str(tmp_path / "tasks")))

        async def make(spec: SandboxSpec):
            made.append(spec)
            return await create_sandbox(sb, spec)

        p = EnvProvider(envs, runtime, make, labels={"run_id": "envtest"})
        runtime.envs = p
        return p

    return {"sb": sb, "envs": envs, "provider": provider, "made": made, "tmp": tmp_path}


async def sandbox_from(world, p: EnvProvider, t: Task):
    spec = await p.runtime.sandbox_spec(t, SandboxSpec(labels={"run_id": "envtest"}))
    sb = await create_sandbox(world["sb"], spec)
    ws = await prepare_workspace(sb, t, p.runtime)
    return sb, ws


@pytest.mark.parametrize("mode", ["overlay", "fuse-overlayfs", "copy"])
async def test_views_are_private_and_the_snapshot_stays_frozen(world, mode):
    world["sb"].local.view = mode
    p = world["provider"]()
    t = task()
    a, ws_a = await sandbox_from(world, p, t)
    b, ws_b = await sandbox_from(world, p, t)
    try:
        assert ws_a.workdir == ws_b.workdir == "/workspace/repo"  # the path it was built at
        assert ws_a.baseline_commit == ws_b.baseline_commit != ws_a.base_commit  # setup's commit, from the build
        r = await a.exec("echo mine > f.txt && echo new > g.txt && rm setup-runs.log && cat .venv/blob | wc -c",
                         cwd=ws_a.workdir)  # fmt: skip
        assert r.ok and r.stdout.strip() == "4000000", r
        r = await b.exec("cat f.txt setup-runs.log; ls", cwd=ws_b.workdir)
        assert r.stdout.split() == ["base", "ran", "f.txt", "setup-runs.log"], r  # b sees none of a's changes
        assert await a.read_file(f"{ws_a.workdir}/g.txt") == b"new\n"  # farm's file calls see the view
        # a rollout's disk is what it changed, not the 4 MB environment (a copy is all of it)
        assert (disk_usage(str(a.dir)) < 1_000_000) is (mode != "copy")
        tree = p.store.tree(p._ids[t.id].key)
        assert (tree / "f.txt").read_text() == "base\n" and not (tree / "g.txt").exists()
        assert (tree / "setup-runs.log").read_text() == "ran\n"
    finally:
        await a.close()
        await b.close()
    assert not mounts_under(world["tmp"] / "sb")  # closed: unmounted, then removed
    assert not list((world["tmp"] / "sb").glob("*/*"))


async def test_one_build_for_a_group_across_providers(world):
    """Eight rollouts of one environment, from two 'actors' (each its own provider,
    sharing the node's cache): setup runs once; every view holds its one run."""
    p1, p2 = world["provider"](), world["provider"]()
    t = task()
    views = await asyncio.gather(*[(p1 if i % 2 else p2).view_for(t) for i in range(8)])
    assert len({v.key for v in views}) == 1
    assert len(p1.built) + len(p2.built) == 1
    assert [s.labels["purpose"] for s in world["made"]] == ["env-build"]
    assert (Path(views[0].lower) / "setup-runs.log").read_text() == "ran\n"


async def test_a_failed_build_is_recorded_once_and_read_back(world):
    p = world["provider"]()
    bad = task("bad", setup=["echo starting", "echo boom-42 >&2; exit 3"])
    errors = await asyncio.gather(*[p.view_for(bad) for _ in range(4)], return_exceptions=True)
    assert all(isinstance(e, EnvBuildFailed) for e in errors), errors
    assert "exited 3" in str(errors[0]) and "boom-42" in str(errors[0]) and "task bad" in str(errors[0])
    assert errors[0].report.steps[-1].exit_code == 3
    assert len(p.built) == 1
    again = world["provider"]()  # a later run (or another actor): no second build
    with pytest.raises(EnvBuildFailed, match="boom-42"):
        await again.view_for(bad)
    assert again.built == []
    assert EnvStore(world["envs"].cache_dir).remove(p._ids["bad"].key)  # `farm envs rm`: the next use builds
    with pytest.raises(EnvBuildFailed):
        await again.view_for(bad)
    assert len(again.built) == 1


async def test_a_build_the_full_disk_failed_is_not_recorded(world):
    """The disk filling mid-build is the machine's state, not the environment's: a system error
    (OSError ENOSPC) for every waiter, nothing recorded, and the next ask builds it again."""
    p = world["provider"]()
    full = task("full", setup=["echo 'error: Failed to install: numba' >&2; echo 'cause: failed to copy file: "
                               "No space left on device (os error 28)' >&2; exit 2"])  # fmt: skip
    errors = await asyncio.gather(*[p.view_for(full) for _ in range(2)], return_exceptions=True)
    assert all(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in errors), errors
    assert f"environment {p._ids['full'].key[:12]} for task full" in str(errors[0]) and "numba" in str(errors[0])
    assert p.store.record(p._ids["full"].key) is None  # no failure sticks (`farm envs rm --failed` not needed)
    assert not list(Path(world["envs"].cache_dir).glob(".build/*"))
    again = world["provider"]()
    with pytest.raises(OSError):
        await again.view_for(full)
    builds = [s for s in world["made"] if s.labels["purpose"] == "env-build"]
    assert len(builds) == 2  # once for the two waiters together, and again when asked again


async def test_a_cancelled_waiter_does_not_cancel_the_build(world):
    p = world["provider"]()
    t = task(setup=["sleep 1", *SETUP])
    first = asyncio.ensure_future(p.view_for(t))
    await async_wait_until(lambda: p._builds, what="its build started")
    first.cancel()
    view = await p.view_for(t)  # the same build, still going
    assert len(p.built) == 1 and (Path(view.lower) / "f.txt").exists()


async def test_settle_waits_for_a_build_no_one_waits_for_any_more(world):
    """A build whose every waiter was cancelled (a validation's sibling grading) goes on,
    shielded; settle() waits for it to be published, so the event loop never closes on it."""
    p = world["provider"]()
    t = task(setup=["sleep 1", *SETUP])
    waiter = asyncio.ensure_future(p.view_for(t))
    await async_wait_until(lambda: p._builds, what="its build started")
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert p._builds and p.store.record(p._ids[t.id].key) is None  # still building, no one asking
    await p.settle()
    assert not p._builds and p.store.record(p._ids[t.id].key).ok


def test_a_build_killed_midway_is_never_used(world, tmp_path):
    """SIGKILL of `farm envs build` during setup: nothing published; the next build
    starts over and publishes a complete snapshot."""
    tasks = tmp_path / "tasks.jsonl"
    slow = task("slow", setup=["echo partial > part.txt", "sleep 30", *SETUP])
    tasks.write_text(slow.model_dump_json() + "\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"envs": {"cache_dir": world["envs"].cache_dir},
                                   "sandbox": {"local": {"base_dir": world["sb"].local.base_dir}},
                                   "tasks": {"cache_dir": str(tmp_path / "tasks")}}))  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "farm", "envs", "build", str(tasks), "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    store = EnvStore(world["envs"].cache_dir)
    deadline = time.monotonic() + 60
    while not list(store.root.glob(".build/*/tree/part.txt")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stdout.read() if proc.poll() else ""
        time.sleep(0.1)  # poll: the loop's deadline bounds the wait
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert [e.record.key for e in store.entries()] == []  # no record: nothing usable
    for pid_dir in Path(world["sb"].local.base_dir).glob("*/*"):  # the dead build's sandbox: reaped
        asyncio.run(reap(pid_dir.parent.name, cfg=world["sb"].local))
    p = world["provider"]()
    fast = slow.model_copy(update={"setup_commands": ["echo partial > part.txt", *SETUP]})
    view = asyncio.run(p.view_for(fast))
    assert (Path(view.lower) / "f.txt").read_text() == "base\n"
    assert not list(store.root.glob(".build/slow*")) and len(list(store.root.glob(".build/*"))) <= 1


async def test_reap_unmounts_a_left_behind_view(world):
    p = world["provider"]()
    t = task()
    sb, _ = await sandbox_from(world, p, t)  # never closed: its actor "died"
    assert mounts_under(sb.dir)
    await reap("envtest", cfg=world["sb"].local)
    assert not mounts_under(sb.dir) and not sb.dir.exists()
    assert (p.store.tree(p._ids[t.id].key) / "f.txt").exists()  # deleted around, never through


@pytest.mark.parametrize("mode", ["overlay", "fuse-overlayfs"])
async def test_identity_and_gc(world, mode):
    world["sb"].local.view = mode
    p = world["provider"]()
    a, a2 = task("a"), task("a2").model_copy(update={"instruction": "something else"})
    b = task("b", setup=[*SETUP, "echo more > m.txt"])
    ka, ka2, kb = [(await p.identity(t)).key for t in (a, a2, b)]
    assert ka == ka2 != kb  # the instruction is not part of the environment; setup is
    assert (await identity_of(task("c", python="none"), p.runtime, mount_root="/workspace")).key != ka
    await p.view_for(a)
    await p.view_for(b)
    store = p.store
    os.utime(store.root / ka / "last_used", (time.time() - 100, time.time() - 100))
    sb, _ = await sandbox_from(world, p, a)  # in use: gc must leave it
    try:
        assert store.in_use(ka)
        assert store.gc(0) == [kb]
    finally:
        await sb.close()
    assert store.gc(0) == [ka]
    assert store.entries() == []
    # two gcs at once (two builds finishing, two processes): the one that finds a snapshot gone
    # between looking and removing goes on; it raised FileNotFoundError and failed a row
    assert store._discard(store.root / ka) is False


def test_envs_cli_ls_rm(world, tmp_path):
    p = world["provider"]()
    asyncio.run(p.view_for(task()))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    base = [sys.executable, "-m", "farm", "envs"]
    s = ["--set", f"envs.cache_dir={world['envs'].cache_dir}"]
    out = subprocess.run([*base, "ls", *s], capture_output=True, text=True, env=env, check=True).stdout
    key = p._ids["t1"].key
    assert key[:12] in out and "t1" in out and "1 snapshot(s)" in out
    out = subprocess.run([*base, "rm", key[:8], *s], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "removed 1" in out.stdout
    assert json.loads(json.dumps([e.record.key for e in EnvStore(world["envs"].cache_dir).entries()])) == []
