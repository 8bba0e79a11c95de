"""bench_scale: the control plane alone at size (what a run of a million rollouts costs the
driver, the reducer and the readers, with no sandbox or model in the way).

A real `farm run` (``farm.run.batch.run_batch``: real Ray, the real Dispatcher, sandbox actors,
the real ReducerActor writing real shards and manifests) over N rollouts in groups of 8,
with parts that create no sandbox, start no CLI and call no engine (``NullParts``: every
phase returns at once, each rollout is a 2-turn token tree (``--turns``) and a graded reward), so what
is measured is what farm's control plane costs per rollout. A ``GroupReader`` follows the
output directory in a thread the whole time, the way a trainer consumes the stream.

Figures:
  rollouts_per_s          rollouts recorded per second of the dispatch loop
  driver_rss_growth_mb    this process's RSS when every rollout is durable minus after the
                          first 10% (the run's end, which reads the directory back for
                          summary.json, is printed apart, with the whole run's peak)
  reducer_rss_growth_mb   the same for the reducer actor's process
  resume_open_s           opening the finished output directory the way a resumed run does
                          (the reducer's store: recover + reconcile + the done ids), from the
                          tables' manifest checkpoints (farm.output.checkpoint)
  resume_open_full_s      the same reading every manifest line and every shard they list
                          (``checkpoints=False``: how every open went before checkpoints)
  inspect_s               `farm inspect OUT` (the CLI, a subprocess)
  group_handout_ms_p99    the following GroupReader: time from a group's last row being
                          durable (its manifest line) to the reader handing the group out
  reader_resume_s         a trainer's GroupReader reopened at the end from the following
                          reader's position (``GroupReader(cursor=...)``, farm.output.cursor)
                          and polled: what finding its place costs (no line before it read)
  reducer_alone_per_s     rollouts per second one ReducerActor makes durable without Ray
                          (its methods awaited in this process): the reducer's own ceiling
  cpu_ms_per_rollout      CPU (user + system) of this process and every process of the
                          local Ray under it (actors, raylet, GCS, agents), per rollout over
                          the RSS growth's window: the machine's cores / this is the most
                          the control plane can run here (by process: printed above it)

``--continuous``: the same rollouts as a continuous stream (``farm.Farm`` pulling groups
under back-pressure, a trainer loop in this process taking each group as it comes: it is
then the consumer whose hand-outs are timed, and its process is the "driver").

Run: ``nice -n 10 .venv/bin/python scripts/bench_scale.py --rollouts 10000``.
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``).
Last line: ``bench_scale: rollouts=… rollouts_per_s=… driver_rss_growth_mb=… reducer_rss_growth_mb=…
resume_open_s=… resume_open_full_s=… inspect_s=… group_handout_ms_p99=… reader_resume_s=…
reducer_alone_per_s=… cpu_ms_per_rollout=…`` (``nan`` where too few samples were taken to say).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections import Counter
from pathlib import Path

GROUP = 8
TURNS = 2  # turns a rollout (--turns); NullParts is pickled by value with it


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """``field`` of /proc/<pid>/status in MB (``RssAnon``: the process's own heap, not the
    files and shared memory it maps)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(d))
    return out


def heap_census(actor: object) -> tuple[float, float, int]:
    """Run in the reducer actor (``__ray_call__``): glibc's heap in use and free in MB, over
    every arena (``mallinfo2``: what the process holds vs what its allocator keeps), and
    the Python objects allocated (``sys.getallocatedblocks``). NaNs where there is no glibc."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return float("nan"), float("nan"), sys.getallocatedblocks()
    mallinfo2.restype = MallInfo2
    m = mallinfo2()
    return m.uordblks / 2**20, m.fordblks / 2**20, sys.getallocatedblocks()


def find_reducer(root: int) -> int | None:
    """The reducer actor's process: a descendant of this one (the local Ray this run started)
    whose title Ray set to ``ray::ReducerActor``."""
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in _children(pid):
            try:
                with open(f"/proc/{child}/cmdline", "rb") as fh:
                    if fh.read().startswith(b"ray::ReducerActor"):
                        return child
            except OSError:
                continue
            todo.append(child)
    return None


def cpu_census(root: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by ``root`` ("driver") and by each kind of
    process under it (the local Ray this run started): its actors by class
    (``ray::ReducerActor``...), Ray's own processes by name. One pass over /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            parent[int(d)], used[int(d)] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError, IndexError):
            continue
    out = {"driver": used.get(root, 0.0)}
    for pid in used:
        up, seen = parent.get(pid), 0
        while up not in (None, 0, 1, root) and seen < 64:
            up, seen = parent.get(up), seen + 1
        if up != root or pid == root:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                title = fh.read().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        actor = title[5:].split(".")[0].split()[0] if title.startswith("ray::") else ""  # ray::SandboxActor.run_many
        kind = {"SandboxActor": "sandbox actors", "ReducerActor": "reducer"}.get(actor, "Ray's own")
        out[kind] = out.get(kind, 0.0) + used[pid]
    return out


class NullParts:
    """Rollout parts with nothing behind them (no sandbox, CLI, gateway or engine)."""

    def __init__(self, cfg, engine_url, *, secrets=None, on_sandbox_created=None):
        self.cfg = cfg

    async def start(self) -> str:
        return "http://null-gateway"

    async def stop(self) -> None:
        return None

    async def create_sandbox(self, spec, purpose):
        return _NullSandbox(spec.rollout_id)

    async def prepare(self, sb, spec):
        return None

    async def open_session(self, spec):
        return spec.rollout_id

    async def run_agent(self, sb, spec, secret, budget_s, workspace):
        from farm.rollout.pipeline import AgentEnd

        return AgentEnd(exit_code=0, log_tail="null agent")

    async def capture(self, sb, spec, workspace):
        return "diff --git a/x b/x\n"

    async def close_session(self, secret):
        from farm.trajectory.tree import TurnTree

        tree, parent = TurnTree(secret), None
        for k in range(TURNS):  # each with the timings the real gateway records (metrics observe them)
            rec = tree.append(parent_id=parent, prompt_delta_ids=[10 + k, 11, 12] if parent is None else [7, 8],
                              output_ids=[100 + k, 101], output_logprobs=[-0.5, -0.25], finish_reason="stop",
                              timings={"plan_ms": 0.2, "render_ms": 0.5, "engine_ms": 900.0, "parse_ms": 0.3,
                                       "record_ms": 0.1})  # fmt: skip
            parent = rec.turn_id
        return tree

    async def grade(self, spec, diff):
        from farm.rollout.pipeline import Grade

        reward = 1.0 if hash(spec.rollout_id) % 3 else 0.0
        return Grade(reward=reward, report={"resolved": reward == 1.0})


class _NullSandbox:
    """What the pipeline reads of a sandbox (farm.sandboxes.base.Sandbox), for a rollout that runs nothing."""

    view = None
    view_ready_s = 0.0
    breaches: list[str] = []
    network_policy: dict[str, str] = {}
    limits_policy: dict[str, str] = {}

    def __init__(self, rid: str) -> None:
        self.id = "null-" + rid

    def busy_processes(self) -> int | None:
        return None

    async def close(self) -> None:
        return None


def tasks_for(n_groups: int):
    from farm.tasks.model import Task

    return [Task(id=f"t{i:07d}", instruction="noop") for i in range(n_groups)]


def group_number(group_id: str) -> int:
    return int(group_id[1:])  # tasks_for's ids


class Follower(threading.Thread):
    """A GroupReader following the output: records when each group was handed out."""

    def __init__(self, out: Path, n_groups: int) -> None:
        super().__init__(daemon=True)
        self.out, self.stop = out, threading.Event()
        # when each group was handed out, by its number (task "t0000123": 123): 8 bytes a
        # group, so that the bench's own record does not count as the driver's growth
        self.handed = array("d", [math.nan]) * n_groups
        self.groups = 0
        self.error: BaseException | None = None
        self.reader = None

    def run(self) -> None:
        from farm.output.groups import GroupReader

        try:
            while not (self.out / "rollouts.manifest.jsonl").exists() and not self.stop.is_set():
                time.sleep(0.05)
            self.reader = reader = GroupReader(self.out, size=GROUP, include_incomplete=True, verify=False)
            for g in reader.follow(poll_interval=0.05, stop=self.stop):
                self.handed[group_number(g.group_id)] = time.time()
                self.groups += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc


def _durable_rows(out: Path) -> int:
    try:
        return (out / "rollouts.manifest.jsonl").read_bytes().count(b'"rollout_ids":') and sum(
            json.loads(ln)["rows"] for ln in (out / "rollouts.manifest.jsonl").read_text().splitlines() if ln)
    except (OSError, ValueError):
        return 0


def manifest_times(out: Path) -> dict[str, float]:
    """group id -> when its last row's manifest line was written (created_at)."""
    last: dict[str, float] = {}
    with open(out / "rollouts.manifest.jsonl") as fh:
        for line in fh:
            entry = json.loads(line)
            for rid in entry["rollout_ids"]:
                gid = rid.rsplit(".", 1)[0]
                last[gid] = max(last.get(gid, 0.0), entry["created_at"])
    return last


def resume_open(cfg, out: Path, total: int, *, checkpoints: bool) -> float:
    """Seconds to open ``out`` as a resumed run's reducer does: the store (each table's
    recovery), ``recover``, ``reconcile`` and the done ids."""
    from farm.output.writer import OutputWriter

    t = time.monotonic()
    store = OutputWriter(out, cfg.output, checkpoints=checkpoints)
    store.recover()
    store.reconcile()
    done_ids = list(store.summaries)  # as ReducerActor.done_ids
    took = time.monotonic() - t
    store.close()
    assert len(done_ids) == total, (len(done_ids), total)
    return took


def reducer_alone(cfg, out: Path, n: int) -> float:
    """Rollouts per second one ReducerActor makes durable (no Ray: its methods awaited in
    this process, ``n`` submits in flight at once): the reducer's fan-in capacity."""
    import asyncio

    from farm.actors.reducer import ReducerActor
    from farm.rollout.model import RolloutResult
    from farm.output.rows import counts_of

    cfg = cfg.model_copy(update={"output": cfg.output.model_copy(update={"dir": str(out)})})
    tree_of = NullParts(cfg, "").close_session

    async def go() -> float:
        reducer = ReducerActor(cfg, metrics=False)
        results = []
        for i in range(n):
            rid = f"r{i // GROUP:07d}.{i % GROUP}"
            tree = await tree_of(rid)
            results.append(RolloutResult(
                run_id=cfg.run_id, rollout_id=rid, group_id=rid.split(".")[0], task_id=rid.split(".")[0],
                sample_index=i % GROUP, harness="claude_code", model="m", status="completed", reward=1.0,
                grading={"resolved": True}, diff="d", agent_log_tail="", counts=counts_of(tree), timings={},
                sandbox_id="s", started_at=0.0, finished_at=1.0, tree=tree))  # fmt: skip
        t = time.monotonic()
        await asyncio.gather(*(reducer.submit(r) for r in results))
        rate = n / (time.monotonic() - t)
        await reducer.close()
        return rate

    return asyncio.run(go())


def run_continuous(cfg, tasks, consumer: Follower, max_ahead: int):
    """The same rollouts as a continuous stream: ``farm.Farm`` (groups pulled under
    back-pressure, ``stream.max_ahead``), and a trainer loop in this thread taking every
    group as it comes (``Farm.groups``), recorded on ``consumer`` as the follower does."""
    from rich.console import Console

    from farm.run.continuous import Farm

    cfg = cfg.model_copy(update={"stream": cfg.stream.model_copy(update={"epochs": 1, "max_ahead": max_ahead})})
    farm = Farm(cfg, tasks=tasks, parts_factory=NullParts, console=Console(quiet=True))
    with farm:  # started: the actors are up, the dispatch loop runs
        t = time.monotonic()
        for group in farm.groups(batch=16):
            consumer.handed[group_number(group.group_id)] = time.time()
            consumer.groups += 1
        took = time.monotonic() - t
    return farm.summary, took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--actors", type=int, default=2, help="sandbox actors")
    ap.add_argument("--concurrency", type=int, default=64, help="rollouts in flight per actor")
    ap.add_argument("--flush-s", type=float, default=0.2, help="ray.reducer_flush_s (farm's default is 2.0)")
    ap.add_argument("--turns", type=int, default=2, help="model turns a rollout (real ones: tens)")
    ap.add_argument("--no-follow", action="store_true", help="no GroupReader in this process (isolates its memory)")
    ap.add_argument("--continuous", action="store_true",
                    help="a continuous stream (farm.Farm: groups pulled under back-pressure, a trainer loop in "
                         "this thread consuming them) instead of a finite `farm run`")
    ap.add_argument("--max-ahead", type=int, default=0,
                    help="--continuous: stream.max_ahead (default: 4 x the slots)")
    ap.add_argument("--out", default=None, help="output directory (default: a temp dir, removed)")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    if args.quick:
        args.rollouts, args.actors, args.concurrency = 64, 1, 8
    global TURNS
    TURNS = args.turns

    from rich.console import Console

    from farm.config import FarmConfig
    from farm.run.batch import run_batch

    n_groups = max(1, args.rollouts // GROUP)
    tmp = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="bench_scale-"))
    out = tmp / "out"
    cfg = FarmConfig.model_validate({
        "run_id": f"scale{os.getpid()}",
        "output": {"dir": str(out)},
        "rollout": {"n_samples": GROUP, "concurrency": args.concurrency, "timeout_s": 600},
        "ray": {"num_sandbox_actors": args.actors, "reducer_flush_s": args.flush_s, "namespace": f"bench-scale-{os.getpid()}",
                "include_dashboard": False, "num_cpus": 4},
        "artifacts": {"enabled": False},
    })
    tasks = tasks_for(n_groups)
    total = n_groups * GROUP

    follower = Follower(out, n_groups)
    if args.continuous:
        args.no_follow = False  # the trainer loop below is the consumer (follower.groups / handed)
    elif not args.no_follow:
        follower.start()
    samples: list[tuple[int, float, float]] = []  # (rollouts durable, driver rss, reducer rss)
    anon: list[float] = []  # the reducer's RssAnon at each sample
    done = threading.Event()
    me = os.getpid()

    cpu: list[tuple[int, dict[str, float]]] = []  # (rollouts durable, cpu_census) every 2 s
    heap: list[tuple[int, tuple[float, float, int]]] = []  # (rollouts durable, heap_census) every ~10 s

    held: list[object] = []  # the reducer actor's handle, once found

    def census_heap(n: int) -> None:
        import ray

        from farm.actors import ray_cluster

        try:
            if not held:
                held.append(ray.get_actor(ray_cluster.actor_name(cfg.run_id, "reducer"), namespace=cfg.ray.namespace))
            heap.append((n, ray.get(held[0].__ray_call__.remote(heap_census), timeout=10)))
        except Exception:  # not up yet, or restarting: the next sample
            pass

    def sample() -> None:
        reducer = None
        k = 0
        while not done.is_set():
            reducer = reducer or find_reducer(me)
            n = follower.groups * GROUP if not args.no_follow else _durable_rows(out)
            samples.append((n, rss_mb(me), rss_mb(reducer) if reducer else 0.0))
            anon.append(rss_mb(reducer, "RssAnon") if reducer else 0.0)
            if k % 4 == 0 and reducer:
                cpu.append((n, cpu_census(me)))
            if k % 20 == 0 and reducer and n < total:  # Ray still up (a call after its shutdown would start one)
                census_heap(n)
            k += 1
            done.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.monotonic()
    if args.continuous:
        summary, loop_s = run_continuous(cfg, tasks, follower, args.max_ahead or 4 * args.actors * args.concurrency)
    else:
        summary = run_batch(cfg, tasks=tasks, parts_factory=NullParts, console=Console(quiet=True))
        loop_s = summary.wall_s
    wall = time.monotonic() - t0
    time.sleep(1.0)
    follower.stop.set()
    if not args.no_follow and not args.continuous:
        follower.join(timeout=60)
    done.set()
    sampler.join()
    if follower.error is not None:
        raise follower.error
    recorded = summary.by_status.get("completed", 0) + sum(v for k, v in summary.by_status.items() if k != "completed")
    assert recorded == total, (recorded, total, summary.by_status)

    # growth: from the first sample past 10% of the rollouts to the last one
    # (to the dispatch loop's end, before the run's end reads the directory back for
    # summary.json; that is reported apart)
    base = next((s for s in samples if s[0] >= total // 10 and s[2] > 0), samples[0])
    # the last sample with the reducer alive: the run's end closes the farm (reducer first)
    # before it reads the directory back
    last = [s for s in samples if s[2] > 0][-1] if any(s[2] > 0 for s in samples) else samples[-1]
    driver_growth = last[1] - base[1]
    # CPU per rollout over the same window (from 10% of the rollouts to the last sample
    # with the reducer alive), by process: what one rollout costs the whole machine
    live = [c for c in cpu if c[1].get("reducer")]
    c0 = next((c for c in live if c[0] >= total // 10), live[0] if live else None)
    # the last sample in which every kind of process of the first is still up (the farm's
    # close stops the sandbox actors before the reducer)
    c1 = next((c for c in reversed(live) if c0 is not None and set(c0[1]) <= set(c[1])), None)
    cpu_ms = {}
    if c0 is not None and c1 is not None and c1[0] > c0[0]:
        cpu_ms = {k: 1000 * (v - c0[1].get(k, 0.0)) / (c1[0] - c0[0]) for k, v in c1[1].items()}
    cpu_total = sum(cpu_ms.values()) or float("nan")
    cores = os.cpu_count() or 1
    print("cpu ms a rollout, by process (10% of the rollouts to the end): "
          + ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu_ms.items(), key=lambda kv: -kv[1]))
          + f"; total {cpu_total:.2f}: {cores} cores give at most {1000 * cores / cpu_total:.0f} rollouts/s",
          file=sys.stderr)
    reducer_growth = last[2] - base[2]
    h = [x for x in heap if x[0] >= total // 10]
    if len(h) >= 2:  # what the reducer holds against what its allocator keeps, over the same window
        (_, (use0, free0, py0)), (_, (use1, free1, py1)) = h[0], h[-1]
        print(f"reducer heap (glibc mallinfo2, {h[0][0]} -> {h[-1][0]} rollouts): in use {use0:.1f} -> "
              f"{use1:.1f} MB, free in the allocator {free0:.1f} -> {free1:.1f} MB; Python blocks {py0} -> {py1}",
              file=sys.stderr)
    else:  # said, not skipped: the census asks every ~10 s while rollouts come in
        print(f"reducer heap: {len(h)} answer(s) from 10% of the rollouts on, too few to compare", file=sys.stderr)
    after = samples[samples.index(last):]  # from the last sample with the reducer alive
    print(f"run end (summary.json: the directory read back): driver RSS {last[1]:.0f} -> "
          f"{max(s[1] for s in after):.0f} MB at most; the whole run's peak "
          f"{max(s[1] for s in samples):.0f} MB", file=sys.stderr)

    # resume: open the finished directory as a resumed run's reducer does, reading every
    # manifest line (checkpoints off: as before them) and from the manifest checkpoints
    resume_full_s = resume_open(cfg, out, total, checkpoints=False)
    resume_open_s = resume_open(cfg, out, total, checkpoints=True)
    print(f"resume open: {resume_full_s:.2f} s reading every manifest line, {resume_open_s:.2f} s from the "
          f"checkpoints", file=sys.stderr)

    reader_resume_s = float("nan")
    if follower.reader is not None:  # a trainer restarting where the follower stopped
        from farm.output.groups import GroupReader

        cursor = follower.reader.position()
        t = time.monotonic()
        late = GroupReader(out, size=GROUP, include_incomplete=True, verify=False, cursor=cursor).poll()
        reader_resume_s = time.monotonic() - t
        print(f"reader resumed from the follower's position: {len(late)} group(s) left, "
              f"{len(cursor.to_json())} bytes of cursor", file=sys.stderr)

    farm_cli = [sys.executable, "-m", "farm", "inspect", str(out)]
    t = time.monotonic()
    subprocess.run(farm_cli, check=True, stdout=subprocess.DEVNULL)
    inspect_s = time.monotonic() - t

    alone = reducer_alone(cfg, tmp / "reducer-alone", min(total, 2_000))
    print(f"reducer alone (no Ray, one process): {alone:.0f} rollouts/s durable", file=sys.stderr)
    lasts = manifest_times(out)
    counts = Counter(type(o).__name__ for o in gc.get_objects())
    print("driver python objects by type (top 8):", counts.most_common(8), file=sys.stderr)
    handed = ((follower.handed[group_number(g)], last) for g, last in lasts.items())
    waits = sorted(max(0.0, h - last) * 1000 for h, last in handed if not math.isnan(h))
    p99 = waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else float("nan")
    if not args.out:
        shutil.rmtree(tmp, ignore_errors=True)
    quarters = [next((x for x in samples if x[0] >= total * q // 4), samples[-1]) for q in (1, 2, 3, 4)]
    print(f"reducer RssAnon: {anon[samples.index(base)]:.0f} -> {anon[samples.index(last)]:.0f} MB", file=sys.stderr)
    print("rss by rollouts durable (n, driver MB, reducer MB): "
          + ", ".join(f"({n}, {d:.0f}, {r:.0f})" for n, d, r in quarters), file=sys.stderr)
    print(f"groups handed out {follower.groups}/{n_groups}; run wall {wall:.1f} s (incl. ray start); "
          f"rss samples {len(samples)}; driver {base[1]:.0f}->{last[1]:.0f} MB, reducer {base[2]:.0f}->"
          f"{last[2]:.0f} MB", file=sys.stderr)
    print(f"bench_scale: rollouts={total} rollouts_per_s={total / loop_s:.0f} "
          f"driver_rss_growth_mb={driver_growth:.1f} reducer_rss_growth_mb={reducer_growth:.1f} "
          f"resume_open_s={resume_open_s:.2f} resume_open_full_s={resume_full_s:.2f} inspect_s={inspect_s:.2f} group_handout_ms_p99={p99:.0f} "
          f"reader_resume_s={reader_resume_s:.3f} reducer_alone_per_s={alone:.0f} cpu_ms_per_rollout={cpu_total:.2f}")


if __name__ == "__main__":
    main()
