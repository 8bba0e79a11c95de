"""The node's CPU by owner, for ``bench_density.py``: every figure from the kernel's own count.

- **sandboxes**: each local sandbox's cgroup counts the CPU of every process its commands
  start, those that exited included (``LocalSandbox.cpu``, nanoseconds); per command, what
  that count grew by while it ran (its jail included). Agent sandboxes split into the CLI's
  command and farm's own commands there (the workspace, the harness's
  files and gateway probe, the diff's capture); grading sandboxes into the task's test
  command and grading's own commands (the steps' script).
- **inside the CLI's and the test command's**: the jail's own processes (the outer
  ``bwrap``, the namespace's init that set up its mounts, the ``socat`` relaying the
  gateway port) stay up, idle, for as long as the command runs, so a reading of their
  ``/proc/<pid>/schedstat`` (nanoseconds of CPU) while it runs is their whole cost; the
  CLI process's own ``/proc/<pid>/stat`` (user + system, all its threads) is read every
  ``period`` s while it runs (what it used in the last ``period`` before it exited is
  counted as its tools'); its tools are the command's count minus both.
- **farm's process**: ``getrusage`` over the window (plus the ``rm`` children that remove
  sandboxes' directories, from their ``wait4``: ``LocalSandbox.removal_cpu_s``, booked with
  the sandbox's making and removal), and by what ran it: every event-loop
  callback's thread CPU goes to the rollout phase of the task it ran for (the gateway's
  request handlers are no rollout's: ``gateway``), every worker-thread job's likewise; the
  loop's own work (``select``, scheduling) is what its thread used outside callbacks; a
  callback no rollout owns is named by its task (``unowned.<coroutine>``: the warm pool's
  sandboxes' watchdogs); every other thread by its pool (``/proc/self/task/<tid>/schedstat``):
  each executor's work around its jobs (``threads.<pool>.outside_jobs``), threads Python did not
  start (``threads.native``: the tokenizer's), threads that ended within the window
  (``threads.exited``: asyncio's child watchers, one a subprocess); ``other_threads`` is what
  is left (near zero).
- **the engine stand-in**: its process's ``/proc/<pid>/stat`` (with its children) over
  the window.

Bare mode (no sandbox) puts each rollout's CLI and test command in an accounting-only cgroup
(``AccountingGroup``: a ``cpuacct``/``cpu.stat`` count, no limit, no jail).
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread as cf_thread
import contextvars
import os
import re
import threading
import resource
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
CLI_MARK = "FARM_LOGIN_PATH"  # in the harness runner's wrapper: the CLI's command
# the grader runs a test command under its witness, whose directory the command names first
from farm.grading.witness import DIRECTORY_PREFIX as WITNESS_MARK  # noqa: E402

# who a callback runs for: a dict its owner keeps current ({"owner": "rollout.<phase>"} in a
# bench slot, {"owner": "gateway"} for what ActorLayers.start leaves running: the gateway's
# server and its engine client); tasks inherit it from the context they were made in
OWNER: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("density_owner", default=None)
# The gateway's work, wherever it was started from (a rollout's sandbox reaches the gateway
# through a unix socket opened from the rollout's own task, and a connection of the engine
# client keeps the context of the turn that opened it): aiohttp's per-connection server task,
# a turn's task, and the socket callbacks of aiohttp's server and client protocols.
GATEWAY_TASKS = {"RequestHandler.start", "RequestHandler._handle_request", "TurnService.run"}
GATEWAY_PROTOCOLS = {"RequestHandler", "ResponseHandler"}
# the bench's own coroutines (its samplers, its slots' driver): their callbacks are not farm's
BENCH_TASKS = ("NodeLedger.", "Sampler.", "LoopLag.", "slots", "run_farm", "main")


# ---- /proc --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcStat:
    comm: str
    ppid: int
    own_s: float  # user + system of all its threads (clock ticks)
    children_s: float  # its reaped children's, likewise


def proc_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    f = text[text.rindex(")") + 2:].split()
    return ProcStat(comm, int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK)


def schedstat_s(pid: int) -> float | None:
    """Nanosecond-exact CPU of ``pid``'s main thread (the jail's processes have one)."""
    return schedstat_s_of(f"/proc/{pid}/schedstat")


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(x) for x in fh.read().split()]
    except OSError:
        return []


def thread_cpu_s() -> dict[int, float]:
    """This process's live threads: their CPU (nanosecond-exact), by thread id."""
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        got = schedstat_s_of(f"/proc/self/task/{tid}/schedstat")
        if got is not None:
            out[int(tid)] = got
    return out


def schedstat_s_of(path: str) -> float | None:
    try:
        with open(path) as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def tree_s(pid: int) -> float:
    """CPU of ``pid`` and every live descendant, with what they reaped (clock ticks)."""
    st = proc_stat(pid)
    if st is None:
        return 0.0
    return st.own_s + st.children_s + sum(tree_s(c) for c in children(pid))


def callback_name(h: asyncio.events.Handle) -> str:
    """What a callback ran: its task's coroutine, else the callback (a second view, for profiling)."""
    me = getattr(h._callback, "__self__", None)
    if isinstance(me, asyncio.Task):
        return me.get_coro().__qualname__
    return getattr(h._callback, "__qualname__", None) or type(me or h._callback).__name__


def pool_of(thread_name: str) -> str:
    """A thread's pool: its name without the number (``asyncio_3``, ``asyncio-waitpid-117``)."""
    return re.sub(r"[-_]\d+$", "", thread_name)


class ThreadCPU:
    """Every thread of this process over a window, by pool (``pool_of`` its Python name;
    ``native`` for threads Python did not start: the tokenizer's, the gRPC ones), and what
    threads that ended inside the window used (asyncio's child watchers: a thread per
    subprocess until it is reaped): the process's count minus its live threads'."""

    def __init__(self) -> None:
        self._t0: dict[int, float] = {}

    def start(self) -> None:
        self._t0 = thread_cpu_s()

    def stop(self, process_s: float) -> tuple[float, dict[str, float]]:
        """(the main thread's CPU, CPU by pool incl. ``exited``) since ``start``."""
        now = thread_cpu_s()
        names = {t.native_id: t.name for t in threading.enumerate()}
        main_id = threading.main_thread().native_id
        main, pools = 0.0, defaultdict(float)
        for tid, s in now.items():
            d = s - self._t0.get(tid, 0.0)
            if tid == main_id:
                main = d
            else:
                pools[pool_of(names[tid]) if tid in names else "native"] += d
        pools["exited"] = process_s - main - sum(pools.values())
        return main, dict(pools)


# ---- farm's process by owner -------------------------------------------------------------------
class LoopCPU:
    """Thread CPU of every event-loop callback, by the owner of the context it ran in (a
    rollout's phase, or ``gateway`` for the server's own work), and of every worker-thread
    job, by its function; a job that works on one sandbox (its directories, view, cgroup:
    a method of it, or a path inside it) is also that sandbox's (``sandbox_of``), any other
    job run for a rollout its phase's."""

    def __init__(self, sandbox_of: Any = None) -> None:
        self.by_owner: dict[str, float] = defaultdict(float)
        self.by_sandbox: dict[int, float] = defaultdict(float)  # id(sandbox) -> its jobs' CPU
        self.thread_phase: dict[str, float] = defaultdict(float)  # rollout.<phase> -> other jobs' CPU
        self.by_callback: dict[tuple[str, str], float] = defaultdict(float)  # (owner, task/callback) -> CPU
        self.jobs_by_pool: dict[str, float] = defaultdict(float)  # thread pool (its threads' name) -> its jobs' CPU
        self.sandbox_of = sandbox_of or (lambda func, args: None)
        self._patched: list[tuple[Any, str, Any]] = []
        self._main_t0 = 0.0
        self.main_s = 0.0  # the loop thread's CPU over the window
        self.callbacks = 0
        self.per_callback_s = 0.0  # what wrapping one callback costs (calibrated at start)

    @property
    def overhead_s(self) -> float:
        """The CPU this accounting added to the loop thread (its callbacks x their calibrated cost)."""
        return self.callbacks * self.per_callback_s

    async def calibrate(self, n: int = 20000) -> None:
        """Time ``n`` empty callbacks without and with the wrapping (thread CPU), keep the difference."""
        async def run() -> float:
            loop = asyncio.get_running_loop()
            done, left = loop.create_future(), [n]

            def step() -> None:
                left[0] -= 1
                loop.call_soon(step) if left[0] else done.set_result(None)

            t0 = time.thread_time()
            loop.call_soon(step)
            await done
            return time.thread_time() - t0

        plain = await run()
        self._patch()
        wrapped = await run()
        self._unpatch()
        self.per_callback_s = max(0.0, (wrapped - plain) / n)

    @staticmethod
    def owner(h: asyncio.events.Handle) -> str:
        owner = getattr(h._callback, "__self__", None)  # a task's step: the task; I/O: the transport
        if isinstance(owner, asyncio.Task):
            if owner.get_coro().__qualname__ in GATEWAY_TASKS:
                return "gateway"
        elif type(getattr(owner, "_protocol", None)).__name__ in GATEWAY_PROTOCOLS:
            return "gateway"
        holder = h._context.get(OWNER) if h._context is not None else None
        if holder:
            return holder["owner"]
        # no rollout's and not the gateway's: the bench's own samplers, or farm's work started
        # outside any rollout (the warm pool's refills): named by its task's coroutine
        if isinstance(owner, asyncio.Task):
            return f"unowned.{owner.get_coro().__qualname__}"
        cb = getattr(h._callback, "__qualname__", None) or type(owner or h._callback).__name__
        return f"unowned.{cb}"

    def start(self) -> None:
        self.callbacks = 0
        self.by_owner.clear()
        self.jobs_by_pool.clear()
        self.by_callback.clear()
        self._patch()
        self._main_t0 = time.thread_time()

    def _patch(self) -> None:
        by_owner, owner = self.by_owner, self.owner
        handle_run = asyncio.events.Handle._run

        by_callback = self.by_callback

        def run_handle(h: asyncio.events.Handle) -> None:
            t0 = time.thread_time()
            try:
                handle_run(h)
            finally:
                self.callbacks += 1
                dt = time.thread_time() - t0
                who = owner(h)
                by_owner[who] += dt
                by_callback[(who, callback_name(h))] += dt

        work_run = cf_thread._WorkItem.run

        def run_work(item: Any) -> None:
            fn = item.fn  # asyncio.to_thread: partial(context.run, func, *args)

            def timed(*a: Any, **kw: Any) -> Any:
                # counted before the future resolves: the loop may act on the result (a sandbox's
                # close callbacks account its jobs) before this thread runs another line
                t0 = time.thread_time()
                try:
                    return fn(*a, **kw)
                finally:
                    book(fn, time.thread_time() - t0)

            item.fn = timed
            work_run(item)

        def book(fn: Any, dt: float) -> None:
            self.jobs_by_pool[pool_of(threading.current_thread().name)] += dt
            ctx = getattr(getattr(fn, "func", None), "__self__", None)
            call = list(getattr(fn, "args", ()) or ()) if isinstance(ctx, contextvars.Context) else [fn]
            func, args = (call[0], call[1:]) if call else (fn, [])
            by_owner[f"threads.{getattr(func, '__qualname__', type(func).__name__)}"] += dt
            sb = self.sandbox_of(func, args)
            holder = ctx.get(OWNER) if isinstance(ctx, contextvars.Context) else None
            if sb is not None:
                self.by_sandbox[id(sb)] += dt
            elif (getattr(func, "__module__", "") or "").startswith("farm.gateway."):
                self.thread_phase["gateway"] += dt  # the render thread, the fidelity check
            elif holder and holder["owner"].startswith("rollout."):
                self.thread_phase[holder["owner"]] += dt

        asyncio.events.Handle._run = run_handle  # type: ignore[method-assign]
        cf_thread._WorkItem.run = run_work  # type: ignore[method-assign]
        self._patched = [(asyncio.events.Handle, "_run", handle_run), (cf_thread._WorkItem, "run", work_run)]

    def _unpatch(self) -> None:
        for cls, name, orig in self._patched:
            setattr(cls, name, orig)
        self._patched = []

    def stop(self) -> None:
        self.main_s = time.thread_time() - self._main_t0
        self._unpatch()


def _command_name(describe: str) -> str:
    """A farm command's name for the ledger: its first words, or a script's first line that is
    not a shell option; a run of hex (a grading step's marker, a sandbox's id) is one name."""
    lines = [ln.strip() for ln in describe.splitlines() if ln.strip() and not ln.strip().startswith("set -")]
    return re.sub(r"[0-9a-f]{8,}", "…", lines[0] if lines else describe)[:48]


# ---- the node ---------------------------------------------------------------------------------
@dataclass
class _Long:
    """A long command's jail and main process, as last read."""

    jail_s: float = 0.0
    main_s: float = 0.0
    main_pid: int = 0


@dataclass
class Ledger:
    """CPU seconds by owner over a window, and the counts to divide them by."""

    owners: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    farm_detail: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # farm's process, a partition
    farm_threads: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # its thread jobs by function
    farm_callbacks: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # its loop callbacks, owner:task
    farm_commands: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # its jailed commands, by name
    jailed_commands: int = 0
    overlapped: int = 0  # commands that ran beside another of their sandbox (their split is shared)
    unsampled: int = 0  # CLI / test commands no sampling caught running (their jail counted as theirs)
    uncounted_sandboxes: int = 0  # no CPU count (no cgroup here)
    ledger_overhead_s: float = 0.0  # the accounting's own CPU in farm's process, left out of farm's

    def per(self, n: int) -> dict[str, float]:
        return {k: v / max(1, n) for k, v in sorted(self.owners.items())}


class NodeLedger:
    """Follows every sandbox a run creates (``track``: ``ActorLayers(on_sandbox=...)``), the
    farm process and the engine's, from ``start`` to ``stop``."""

    def __init__(self, engine_pid: int, *, test_commands: list[str], period: float = 0.5) -> None:
        self.engine_pid = engine_pid
        self.tests = [t[:60] for t in test_commands if t]
        self.period = period
        self.loop_cpu = LoopCPU(self._sandbox_of)
        self.threads = ThreadCPU()
        self._live: dict[int, Any] = {}
        self._dirs: dict[str, Any] = {}  # a tracked sandbox's directory -> the sandbox
        self._at_start: dict[int, tuple[float, int]] = {}  # sandboxes alive at start: (count, commands) then
        self._long: dict[tuple[int, int], _Long] = {}  # (sandbox, command key) -> last reading
        self.ledger = Ledger()
        self._running = False
        self._task: asyncio.Task[None] | None = None
        self._r0 = self._e0 = 0.0
        self.sampler_s = 0.0  # the ledger's own reading (not farm's)
        self.removal_s = 0.0  # the `rm` children that removed sandboxes' directories (farm's, out of its process)

    # ---- sandboxes --------------------------------------------------------------------
    def track(self, sb: Any) -> None:
        book = getattr(sb, "cpu", None)
        if book is None:
            return
        self._live[id(sb)] = sb
        self._dirs[str(sb.dir)] = sb
        sb.add_close_callback(lambda: self._closed(sb))

    def _sandbox_of(self, func: Any, args: list[Any]) -> Any:
        """The tracked sandbox a thread job worked on: its method's, or a path argument's."""
        me = getattr(func, "__self__", None)
        if me is not None and id(me) in self._live:
            return me
        for a in args:
            if isinstance(a, (str, Path)):
                path = str(a)
                for d, sb in list(self._dirs.items()):  # (a worker thread: the loop adds and removes sandboxes)
                    if path == d or path.startswith(d + "/"):
                        return sb
        return None

    def _closed(self, sb: Any) -> None:
        self._live.pop(id(sb), None)
        if self._running:
            self._account(sb)
        self._dirs.pop(str(sb.dir), None)

    def _kind(self, describe: str) -> str:
        if CLI_MARK in describe:
            return "cli"
        # under the witness, the command itself may lie beyond the description's 200 characters
        if any(t in describe for t in self.tests) or WITNESS_MARK in describe:
            return "test"
        return "other"

    def _account(self, sb: Any) -> None:
        """Fold one sandbox's count (since start) into the owners."""
        book, led = sb.cpu, self.ledger
        total = book.total_s()
        if total is None:
            led.uncounted_sandboxes += 1
            return
        before, first = self._at_start.pop(id(sb), (0.0, 0))
        total -= before
        purpose = sb.labels.get("purpose", "pool")
        # farm's process: the thread jobs that made and removed this sandbox (its dirs, view, cgroup)
        led.farm_detail[f"sandbox_lifecycle.{purpose}"] += self.loop_cpu.by_sandbox.pop(id(sb), 0.0)
        # and the `rm` that removed its directories: a child of farm's process, run for it
        removal = getattr(sb, "removal_cpu_s", 0.0)
        led.farm_detail[f"sandbox_lifecycle.{purpose}"] += removal
        self.removal_s += removal
        own = {"agent": "agent.farm_cmds", "grading": "grading.own_cmds"}.get(purpose, "pool.idle")
        counted = 0.0
        for cmd in book.commands:
            if cmd.key <= first:  # ran before the window
                continue
            led.jailed_commands += 1
            led.overlapped += 0 if cmd.alone else 1
            kind = self._kind(cmd.describe)
            if kind == "other":
                led.owners[own] += cmd.cpu_s
                led.farm_commands[f"{purpose}:{_command_name(cmd.describe)}"] += cmd.cpu_s
                counted += cmd.cpu_s
                continue
            long = self._long.pop((id(sb), cmd.key), None)
            if long is None:  # ended before a sampling read it (a test run shorter than ``period``):
                led.unsampled += 1  # still the test's (or the CLI's), its jail's part not known apart
                long = _Long()
            if kind == "cli":
                led.owners["agent.jail"] += long.jail_s
                led.owners["agent.cli"] += long.main_s
                led.owners["agent.tools"] += max(0.0, cmd.cpu_s - long.jail_s - long.main_s)
            else:
                led.owners["grading.jail"] += long.jail_s
                led.owners["grading.test"] += max(0.0, cmd.cpu_s - long.jail_s)
            counted += cmd.cpu_s
        led.owners[f"{purpose}.between_commands"] += max(0.0, total - counted)

    # ---- sampling -----------------------------------------------------------------------
    def _read_long(self) -> None:
        """The jail and main process of every running CLI / test command."""
        for sb in list(self._live.values()):
            for key, describe, pid in sb.cpu.running():
                if self._kind(describe) == "other":
                    continue
                jail = [pid, *children(pid)]  # the outer bwrap and the namespace's init
                inits = jail[1:]
                main = [c for i in inits for c in children(i)]
                if not inits or not main:
                    continue  # still starting: read next time
                rec = self._long.setdefault((id(sb), key), _Long())
                jail_s = sum(schedstat_s(p) or 0.0 for p in jail)
                for m in main:
                    for c in children(m):
                        st = proc_stat(c)
                        if st is not None and st.comm == "socat":  # the gateway relay and its forks
                            jail_s += st.own_s + st.children_s
                st = proc_stat(main[0])
                rec.jail_s = max(rec.jail_s, jail_s)
                if st is not None:
                    rec.main_s, rec.main_pid = max(rec.main_s, st.own_s), main[0]

    async def _sample(self) -> None:
        while self._running:
            t0 = time.thread_time()
            self._read_long()
            self.sampler_s += time.thread_time() - t0
            await asyncio.sleep(self.period)

    def _engine_s(self) -> float:
        return tree_s(self.engine_pid) if self.engine_pid else 0.0

    # ---- window -----------------------------------------------------------------------
    def start(self) -> None:
        for sb in self._live.values():
            done = max((c.key for c in sb.cpu.commands), default=0)
            self._at_start[id(sb)] = (sb.cpu.total_s() or 0.0, done)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self._r0 = ru.ru_utime + ru.ru_stime
        self._e0 = self._engine_s()
        self.threads.start()
        self.loop_cpu.start()
        self._running = True
        self._task = asyncio.ensure_future(self._sample())

    async def stop(self, exclude_s: float = 0.0) -> Ledger:
        """End the window (every rollout done; live sandboxes, e.g. the pool's, read as they
        are). ``exclude_s``: the bench's own CPU in this process (its memory sampler)."""
        self._running = False
        if self._task is not None:
            await self._task
        self.loop_cpu.stop()
        for sb in list(self._live.values()):
            self._account(sb)
        ru = resource.getrusage(resource.RUSAGE_SELF)
        led = self.ledger
        cpu = self.loop_cpu
        led.ledger_overhead_s += cpu.overhead_s + self.sampler_s  # this accounting's own CPU: not farm's
        process_s = ru.ru_utime + ru.ru_stime - self._r0
        _, pools = self.threads.stop(process_s)
        farm = process_s - exclude_s - self.sampler_s - cpu.overhead_s + self.removal_s
        led.owners["farm.process"] += farm
        led.owners["engine"] += self._engine_s() - self._e0
        callbacks = {k: v for k, v in cpu.by_owner.items() if not k.startswith("threads.")}
        jobs = {k: v for k, v in cpu.by_owner.items() if k.startswith("threads.")}
        unowned = {k: callbacks.pop(k) for k in [k for k in callbacks if k.startswith("unowned.")]}
        # the bench's own tasks (the ledger's and the memory sampler) are not farm's
        bench = sum(v for k, v in unowned.items() if k.split(".", 1)[1].startswith(BENCH_TASKS))
        for k, v in unowned.items():
            if not k.split(".", 1)[1].startswith(BENCH_TASKS):
                callbacks[k] = v
        # farm's process by owner (a partition): the gateway, each rollout phase (its callbacks and
        # thread jobs), each kind of sandbox's making and removal (at its account), the loop's own
        # work, and what no callback or job holds (asyncio's child watchers, the tokenizer's threads)
        view = {k: v for k, v in callbacks.items()}
        for phase, v in cpu.thread_phase.items():
            view[phase] = view.get(phase, 0.0) + v
        view["loop.select_and_scheduling"] = max(0.0, cpu.main_s - sum(callbacks.values()) - bench - cpu.overhead_s)
        lifecycle = sum(v for k, v in led.farm_detail.items() if k.startswith("sandbox_lifecycle."))
        # the threads outside the loop, beyond the jobs booked above: each pool's own work
        # around its jobs (waking, queueing: ``<pool>.outside_jobs``), jobs run for no rollout,
        # sandbox or gateway (the pool's refills, the engine client's), threads with no jobs
        jobs_total = sum(jobs.values())
        phases = sum(cpu.thread_phase.values())
        view["threads.unowned_jobs"] = max(0.0, jobs_total - exclude_s - lifecycle - phases)
        for pool, v in pools.items():
            booked = cpu.jobs_by_pool.get(pool, 0.0)
            view[f"threads.{pool}" + (".outside_jobs" if booked else "")] = max(0.0, v - booked)
        view["other_threads"] = max(0.0, farm - sum(view.values()) - lifecycle)
        for k, v in view.items():
            led.farm_detail[k] += v
        for (who, name), v in cpu.by_callback.items():
            if not (who.startswith("unowned.") and who.split(".", 1)[1].startswith(BENCH_TASKS)):
                led.farm_callbacks[f"{who}:{name}"] += v
        for k, v in jobs.items():  # the thread jobs by function (a second view, for profiling)
            if not k.startswith("threads.Sampler"):
                led.farm_threads[k] += v
        return led


# ---- bare mode ---------------------------------------------------------------------------------
class AccountingGroup:
    """An accounting-only cgroup (no limit, no jail) whose count is a bare command's CPU."""

    def __init__(self, name: str) -> None:
        self.dir: Path | None = None
        self.v2 = False
        own = _own_cgroup("cpuacct")
        root = Path("/sys/fs/cgroup/cpuacct")
        if own is not None and (root / "cgroup.procs").exists():
            self.dir = root / own.lstrip("/") / "density-bare" / name
        else:
            unified = _own_cgroup("")
            mount = Path("/sys/fs/cgroup") if Path("/sys/fs/cgroup/cgroup.controllers").exists() else None
            if unified is not None and mount is not None:
                self.dir, self.v2 = mount / unified.lstrip("/") / "density-bare" / name, True
        if self.dir is not None:
            try:
                self.dir.mkdir(parents=True)
            except OSError:
                self.dir = None

    def prefix(self) -> list[str]:
        """argv prefix that puts the command in the group, then execs it."""
        if self.dir is None:
            return []
        return ["/bin/sh", "-c", f'echo $$ > {self.dir}/cgroup.procs; exec "$@"', "density"]

    def cpu_s(self) -> float | None:
        if self.dir is None:
            return None
        try:
            if self.v2:
                for line in (self.dir / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec "):
                        return int(line.split()[1]) / 1e6
                return None
            return int((self.dir / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        if self.dir is None:
            return
        for _ in range(100):
            try:
                self.dir.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)
        try:
            self.dir.parent.rmdir()
        except OSError:
            pass


def _own_cgroup(controller: str) -> str | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if controller in ctrls.split(",") or (controller == "" and ctrls == ""):
                return path
    except OSError:
        pass
    return None
