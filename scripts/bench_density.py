#!/usr/bin/env python
"""A node full of rollouts: how many one node keeps busy, where its CPU goes, and how close
farm comes to the same CLIs with no farm around them.

**farm** runs one sandbox actor's rollout path (``ActorLayers`` + ``RolloutPipeline``, in
this process, without Ray: what a ``SandboxActor`` runs): real local sandboxes (bubblewrap,
cgroups, copy-on-write views of the environment snapshots), a real CLI (``--harness``,
default Codex), graded in fresh sandboxes. **bare** (``--baseline bare``, ``density_bare``)
runs the same CLIs on the same tasks with no farm: each in a copy of the environment's
tree, pointed at the engine's own endpoint (the same scripted worker behind a protocol
front, as SGLang serves the OpenAI protocols itself), then the test command run in place.
Both talk to the scripted oracle worker with a GPU-like turn time: ``--turn-s`` (+-20 %).

``--n`` slots run rollouts back to back for ``--duration-s`` (then finish what runs), on
``--tasks`` demo tasks (one environment each, built before the clock starts). The capacity
is found by stepping the slots (``--steps``, and ``--n``): at each step farm and bare run
one after the other in this process; ``capacity_at_90`` is the most slots at which
``slot_utilization`` >= 0.9 (stepping stops for a mode after its first step below).
``--modes``: farm ``cold`` (every sandbox created when asked) and/or ``pool``
(``sandbox.pool``); the last one listed is the one stepped and on the last line.

Figures per run:

- ``in_flight``: rollouts running at once, time-averaged over the window;
- ``slot_utilization``: the fraction of slot time the agent runs (the phase a GPU engine
  serves), over the window;
- ``overhead_p50_s`` / ``overhead_p95_s``: per rollout, total minus the agent phase minus
  the test command (farm: create, prepare, session, capture, grading's own work; bare: the
  tree's copy);
- ``farm_cpu_ms_per_turn``: this process's CPU (gateway, pipeline, sandbox management; not
  the engine, the CLIs, or the bench's own samplers) per model turn;
- the node's CPU by owner (``density_ledger``: cgroups per sandbox, ``/proc`` per process),
  per rollout and (farm's process) per turn by what ran it;
- ``farm_cpu_share``: farm's own CPU (its process, the jails, its commands in the sandboxes:
  workspace, capture, grading's own) over the node's, the engine stand-in left out (a real
  engine runs on its GPU nodes);
- ``rss_mb_per_rollout`` (``cli_mb`` PSS of the sandboxes' processes + ``farm_mb``), ``create_p50_ms``.

Last line: ``bench_density: in_flight=… slot_utilization=… overhead_p50_s=…
farm_cpu_ms_per_turn=… capacity_at_90=… bare_capacity_at_90=… capacity_ratio=…
farm_cpu_share=…`` (the farm figures from its run at ``--n``). Defaults are the issue's
measurement (16 slots, 10 s turns, 120 s, pool, bare baseline, steps 8..64: ~40 min);
``--quick`` is the suite's size (1 task, 2 slots, 1 s turns: a check that it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from density_bare import BareRollouts, served_turns, start_endpoint
from density_ledger import OWNER, NodeLedger
from farm.config import FarmConfig, load_config
from farm.engine.config import LatencyConfig
from farm.engine.launchers import start_scripted_worker
from farm.grading import grading_spec
from farm.harnesses import make_harness
from farm.modeltext.tokenizer import resolve_tokenizer
from farm.rollout.actor_layers import ActorLayers
from farm.rollout.model import RolloutSpec
from farm.rollout.pipeline import RolloutPipeline
from farm.sandboxes.base import SandboxSpec
from farm.tasks.loaders import load_tasks, resolve_tasks_path

MB = 1024 * 1024
FARM_OWNERS = ("farm.process", "agent.farm_cmds", "agent.jail", "grading.own_cmds", "grading.jail",
               "agent.between_commands", "grading.between_commands", "pool.between_commands", "pool.idle")


def config(args: argparse.Namespace, work: Path, pool: bool, n: int) -> FarmConfig:
    return load_config(None, [
        f"run_id=density-{'pool' if pool else 'cold'}-{n}",
        "tasks.path=demo",
        f"harness.name={args.harness}",
        "engine.mode=scripted", "engine.policy=oracle", "engine.tokenizer=builtin:farm-test",
        "engine.tool_parser=hermes",
        f"sandbox.local.base_dir={work / 'sandboxes'}",
        # live sandboxes: every rollout's own, the grading ones, the pool's
        f"rollout.sandbox_create_concurrency={2 * n + 8 * pool_size(args, n) + 8}",
        f"rollout.sandbox_create_rate={max(4.0, n / 2)}",
        f"rollout.concurrency={n}", "rollout.max_turns=30", "rollout.timeout_s=900",
        f"sandbox.pool.size={pool_size(args, n) if pool else 0}",
        f"sandbox.pool.max_environments={2 * args.tasks}",  # agent + grading spec per environment
        "sandbox.pool.refill_concurrency=2",
        "artifacts.enabled=false",
        *args.set,
    ])


def pick_tasks(cfg: FarmConfig, args: argparse.Namespace) -> list[Any]:
    tasks = load_tasks(cfg.tasks).tasks
    if not args.task:
        return tasks[: args.tasks]
    by_id = {t.id: t for t in tasks}
    missing = [i for i in args.task if i not in by_id]
    if missing:
        raise SystemExit(f"no demo task {missing}: the set has {sorted(by_id)}")
    return [by_id[i] for i in args.task]


def pool_size(args: argparse.Namespace, n: int) -> int:
    return args.pool_size if args.pool_size is not None else -(-n // args.tasks)  # the first burst is warm too


class Sampler:
    """Every ``period`` s: this process's RSS and the PSS of every sandbox process."""

    def __init__(self, engine_pid: int, period: float = 3.0) -> None:
        self.me = psutil.Process()
        self.engine_pid = engine_pid
        self.period = period
        self.samples: list[tuple[float, float, float]] = []  # (t, farm rss, sandbox pss)
        self.cpu_s = 0.0  # the sampler's own CPU (reading smaps is kernel work): not farm's

    def sandbox_pss(self) -> float:
        t0 = time.thread_time()
        try:
            total = 0.0
            for child in self.me.children(recursive=True):
                try:
                    if child.pid == self.engine_pid or child.ppid() == self.engine_pid:
                        continue
                    total += child.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            return total
        finally:
            self.cpu_s += time.thread_time() - t0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            pss = await asyncio.to_thread(self.sandbox_pss)
            self.samples.append((time.monotonic(), self.me.memory_info().rss, pss))
            try:
                await asyncio.wait_for(stop.wait(), self.period)
            except TimeoutError:
                pass


def overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def slots(n: int, duration: float, one: Any) -> tuple[list[dict[str, Any]], float, float]:
    """``n`` slots calling ``one(i, k, phases)`` back to back until the deadline; each record
    holds start, end and the phase marks [(name, t)] the rollout reported."""
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    deadline = t0 + duration

    async def slot(i: int) -> None:
        k = 0
        while time.monotonic() < deadline:
            phases: list[tuple[str, float]] = []
            start = time.monotonic()
            result = await one(i, k, phases)
            records.append({"start": start, "end": time.monotonic(), "phases": phases, "result": result})
            k += 1

    await asyncio.gather(*(slot(i) for i in range(n)))
    return records, t0, deadline


def occupancy(records: list[dict[str, Any]], n: int, t0: float, t1: float) -> tuple[float, float]:
    """(rollouts in flight, slot utilization) over [t0, t1]: agent phases count as busy."""
    window = t1 - t0
    running = sum(overlap(r["start"], r["end"], t0, t1) for r in records)
    busy = 0.0
    for r in records:
        marks = r["phases"] + [("end", r["end"])]
        for (name, a), (_, b) in zip(marks, marks[1:]):
            if name == "agent":
                busy += overlap(a, b, t0, t1)
    return round(running / window, 1), round(busy / (n * window), 3)


# ---- farm --------------------------------------------------------------------------------------
async def run_farm(args: argparse.Namespace, work: Path, engine_url: str, engine_pid: int, pool: bool,
                   n: int) -> dict:
    cfg = config(args, work, pool, n)
    tasks = pick_tasks(cfg, args)
    ledger = NodeLedger(engine_pid, test_commands=[t.test_command or "" for t in tasks])
    parts = ActorLayers(cfg, engine_url, on_sandbox=ledger.track)
    OWNER.set({"owner": "gateway"})  # what start leaves running: the gateway's server, its engine client
    await parts.start()
    OWNER.set(None)
    pipeline = RolloutPipeline(parts, harness=cfg.harness.name, model=cfg.engine.model_name,
                               timeout_s=cfg.rollout.timeout_s, actor="bench")
    # environments built (and the CLI installed in the host cache) before the clock starts
    for t in tasks:
        await parts.runtime.sandbox_spec(t, SandboxSpec())
    await parts.harness.host_prefix()
    if pool:  # one acquire per environment starts its refilling; wait until the pools are full
        warm = [parts.create_sandbox(_spec(cfg, t, f"warm{i}"), "agent") for i, t in enumerate(tasks)]
        warm += [parts.create_sandbox(_spec(cfg, t, f"warm{i}"), "grading", grading_spec(t, {"run_id": cfg.run_id}))
                 for i, t in enumerate(tasks)]
        for sb in await asyncio.gather(*warm):
            await sb.close()
        async with asyncio.timeout(600):
            while parts.pool.idle < 2 * pool_size(args, n) * len(tasks):
                await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    sampler = Sampler(engine_pid)
    base_rss = sampler.me.memory_info().rss

    async def one(i: int, k: int, phases: list[tuple[str, float]]) -> Any:
        holder = {"owner": "rollout.create_sandbox"}
        OWNER.set(holder)  # this slot's task: every callback of its rollout is the rollout's

        def observe(kind: str, d: dict) -> None:
            if kind == "phase":
                phases.append((d["phase"], time.monotonic()))
                holder["owner"] = f"rollout.{d['phase']}"

        return await pipeline.run(_spec(cfg, tasks[(i + k) % len(tasks)], f"n{n}-s{i}-{k}"), observe)

    stop = asyncio.Event()
    sampling = asyncio.ensure_future(sampler.run(stop))
    ledger.start()
    records, t0, t1 = await slots(n, args.duration_s, one)
    stop.set()
    await sampling
    led = await ledger.stop(exclude_s=sampler.cpu_s)
    pool_stats = vars(parts.pool.stats).copy()
    await parts.stop()
    out = summarize_farm(records, n, t0, t1, sampler, base_rss)
    out.update(cpu_report(led, out["rollouts"], out["turns"]))
    out["pool"] = pool_stats
    return out


def _spec(cfg: FarmConfig, task: Any, rid: str) -> RolloutSpec:
    return RolloutSpec(run_id=cfg.run_id, rollout_id=rid, group_id=task.id, sample_index=0, task=task)


def summarize_farm(records, n, t0, t1, sampler, base_rss) -> dict:
    overheads, creates, turns, statuses = [], [], 0, {}
    phase_s: dict[str, list[float]] = {}
    reasons: dict[str, str] = {}
    for r in records:
        res = r["result"]
        statuses[res.status.value] = statuses.get(res.status.value, 0) + 1
        if res.status.value != "completed":
            reasons.setdefault(res.status.value, res.reason[:300])
        test_s = ((res.grading or {}).get("timings") or {}).get("test_s", 0.0)
        overheads.append(res.timings.get("total", 0.0) - res.timings.get("agent", 0.0) - test_s)
        creates.append(res.timings.get("create_sandbox", 0.0) * 1000)
        turns += res.counts.turns
        for name, v in res.timings.items():
            phase_s.setdefault(name, []).append(v)
        for name, v in ((res.grading or {}).get("timings") or {}).items():
            phase_s.setdefault(f"grade.{name}", []).append(v)
        engine = [t.timings.get("engine_ms", 0.0) / 1000 for t in (res.tree.turns if res.tree is not None else [])]
        phase_s.setdefault("agent.model", []).append(sum(engine))
        phase_s.setdefault("agent.cli_own", []).append(res.timings.get("agent", 0.0) - sum(engine))
    in_flight, util = occupancy(records, n, t0, t1)
    steady = [(rss, pss) for t, rss, pss in sampler.samples if t0 + 0.2 * (t1 - t0) <= t <= t1]
    farm_mb = statistics.median([(rss - base_rss) / MB for rss, _ in steady]) / in_flight if steady else float("nan")
    cli_mb = statistics.median([pss / MB for _, pss in steady]) / in_flight if steady else float("nan")
    return {
        "in_flight": in_flight, "slot_utilization": util,
        "overhead_p50_s": round(pct(overheads, 0.5), 2), "overhead_p95_s": round(pct(overheads, 0.95), 2),
        "rss_mb_per_rollout": round(farm_mb + cli_mb, 1), "create_p50_ms": round(pct(creates, 0.5), 1),
        "cli_mb": round(cli_mb, 1), "farm_mb": round(farm_mb, 1), "rollouts": len(records), "turns": turns,
        "sampler_cpu_s": round(sampler.cpu_s, 2),  # the bench's own PSS sampling, left out of farm's
        "statuses": statuses, "reasons": reasons,
        "phases_p50_s": {k: round(statistics.median(v), 3) for k, v in phase_s.items()},
    }


def cpu_report(led: Any, rollouts: int, turns: int) -> dict:
    owners = dict(led.owners)
    node = sum(v for k, v in owners.items() if k != "engine")
    farm = sum(owners.get(k, 0.0) for k in FARM_OWNERS)
    def per_turn(d: dict[str, float]) -> dict[str, float]:
        return {k: round(1000 * v / max(1, turns), 2) for k, v in sorted(d.items(), key=lambda kv: -kv[1])
                if v * 1000 / max(1, turns) >= 0.05}

    grade_own = sum(owners.get(k, 0.0) for k in ("grading.own_cmds", "grading.jail", "grading.between_commands"))
    grade_own += sum(led.farm_detail.get(k, 0.0) for k in ("rollout.grade", "sandbox_lifecycle.grading"))
    return {
        "farm_cpu_ms_per_turn": round(1000 * owners.get("farm.process", 0.0) / max(1, turns), 1),
        "farm_cpu_share": round(farm / node, 3) if node else float("nan"),
        "cpu_s_per_rollout": {k: round(v, 3) for k, v in led.per(rollouts).items() if abs(v) >= 0.0005},
        "grading_own_cpu_s_per_rollout": round(grade_own / max(1, rollouts), 3),
        "farm_ms_per_turn_by_owner": per_turn(led.farm_detail),
        "farm_thread_jobs_ms_per_turn": per_turn(led.farm_threads),
        "jail_start_ms_p50": round(1000 * pct(led.jail_starts, 0.5), 1),
        "jailed_commands_per_rollout": round(led.jailed_commands / max(1, rollouts), 1),
        "overlapped_commands": led.overlapped,
        "uncounted_sandboxes": led.uncounted_sandboxes,
    }


# ---- bare ----------------------------------------------------------------------------------------
async def run_bare(args: argparse.Namespace, work: Path, url: str, endpoint_pid: int, n: int,
                   trees: dict[str, Any], tasks: list[Any], prefixes: dict[str, str]) -> dict:
    from density_ledger import tree_s
    import resource

    harness = make_harness(load_config(None, [f"harness.name={args.harness}"]).harness)
    await harness.install()
    bare = BareRollouts(harness, tasks, trees, url, work / "bare", model="farm-policy", python_prefix=prefixes,
                        timeout_s=900)
    turns0, e0 = await served_turns(url), tree_s(endpoint_pid)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)

    async def one(i: int, k: int, phases: list[tuple[str, float]]) -> Any:
        t = time.monotonic()
        res = await bare.run(i + k)
        tm = res["timings"]
        phases += [("prep", t), ("agent", t + tm["prep"]), ("test", t + tm["prep"] + tm["agent"])]
        return res

    records, t0, t1 = await slots(n, args.duration_s, one)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    turns = await served_turns(url) - turns0
    in_flight, util = occupancy(records, n, t0, t1)
    overheads = [r["end"] - r["start"] - r["result"]["timings"]["agent"] - r["result"]["timings"]["test"]
                 for r in records]
    owners = dict(bare.cpu)
    owners["engine"] = tree_s(endpoint_pid) - e0  # its protocol front included: the engine's own endpoint
    owners["bare.driver"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {
        "in_flight": in_flight, "slot_utilization": util,
        "overhead_p50_s": round(pct(overheads, 0.5), 2), "overhead_p95_s": round(pct(overheads, 0.95), 2),
        "rollouts": len(records), "turns": turns,
        "resolved": sum(1 for r in records if r["result"]["resolved"]),
        "cli_exit_codes": sorted({r["result"]["exit_code"] for r in records}),
        "cpu_s_per_rollout": {k: round(v / max(1, len(records)), 3) for k, v in sorted(owners.items())},
    }


# ---- the run ---------------------------------------------------------------------------------------
def show(label: str, r: dict) -> None:
    nested = ("statuses", "reasons", "pool", "phases_p50_s", "cpu_s_per_rollout", "farm_ms_per_turn_by_owner",
              "farm_thread_jobs_ms_per_turn")
    print(f"bench_density[{label}]: " + " ".join(f"{k}={v}" for k, v in r.items() if k not in nested), flush=True)
    for key in nested:
        if key in r:
            print(f"  {key}={r[key]}", flush=True)


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-density-"))
    cfg = config(args, work, False, args.n)
    tasks_path = str(resolve_tasks_path(cfg.tasks))
    tokenizer = resolve_tokenizer(cfg.engine.tokenizer, cfg.engine.tokenizer_cache_dir)
    proc, url = await start_scripted_worker(
        dict(policy="oracle", tokenizer=tokenizer, tasks_path=tasks_path, tool_format="hermes",
             model_name=cfg.engine.model_name, latency=LatencyConfig(ttft_s=args.turn_s, jitter=0.2)),
        log_dir=work, name="scripted-0", timeout=120)
    bare_proc = None
    farm_mode = args.modes[-1]
    results: dict[str, dict] = {}
    capacity: dict[str, int] = {}
    try:
        if args.baseline == "bare":
            bare_proc, bare_url = await start_endpoint(tokenizer=tokenizer, tasks_path=tasks_path, turn_s=args.turn_s,
                                                       model_name=cfg.engine.model_name, work=work)
            trees, tasks, prefixes = await prepared_trees(cfg, args, url)
        for mode in args.modes[:-1]:  # the other farm modes, at --n only
            results[mode] = await run_farm(args, work, url, proc.pid or 0, mode == "pool", args.n)
            show(f"{mode} n={args.n}", results[mode])
        steps = sorted({*args.steps, args.n})
        going = {"farm": True, "bare": args.baseline == "bare"}
        for n in steps:
            if n > args.n and not any(going.values()):
                break
            if going["farm"] or n == args.n:
                r = await run_farm(args, work, url, proc.pid or 0, farm_mode == "pool", n)
                show(f"{farm_mode} n={n}", r)
                if n == args.n:
                    results[farm_mode] = r
                going["farm"] = going["farm"] and r["slot_utilization"] >= 0.9
                capacity["farm"] = n if going["farm"] else capacity.get("farm", 0)
            if going["bare"]:
                b = await run_bare(args, work, bare_url, bare_proc.pid, n, trees, tasks, prefixes)
                show(f"bare n={n}", b)
                going["bare"] = b["slot_utilization"] >= 0.9
                capacity["bare"] = n if going["bare"] else capacity.get("bare", 0)
    finally:
        await proc.astop()
        if bare_proc is not None and bare_proc.returncode is None:
            bare_proc.kill()
            await bare_proc.wait()
    final = results[farm_mode]
    cap, bare_cap = capacity.get("farm", 0), capacity.get("bare", 0)
    ratio = round(cap / bare_cap, 2) if bare_cap else float("nan")
    line = {k: final[k] for k in ("in_flight", "slot_utilization", "overhead_p50_s", "farm_cpu_ms_per_turn")}
    line.update(capacity_at_90=cap, bare_capacity_at_90=bare_cap if args.baseline == "bare" else "nan",
                capacity_ratio=ratio, farm_cpu_share=final["farm_cpu_share"])
    print("bench_density: " + " ".join(f"{k}={v}" for k, v in line.items()), flush=True)


async def prepared_trees(cfg: FarmConfig, args: argparse.Namespace, url: str) -> tuple[dict, list, dict]:
    """Each task's environment (built now if it is not yet: before any clock), the tree a bare
    rollout copies, and the task's interpreter's PATH prefix."""
    parts = ActorLayers(cfg, url)
    await parts.start()
    try:
        tasks = pick_tasks(cfg, args)
        trees = {t.id: await parts.runtime.envs.view_for(t) for t in tasks}
        prefixes = {t.id: parts.runtime.path_prefix_for(t) or "" for t in tasks}
    finally:
        await parts.stop()
    return trees, tasks, prefixes


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16, help="slots of the farm run the last line reports")
    ap.add_argument("--turn-s", type=float, default=10.0, help="model time per turn (the worker's ttft)")
    ap.add_argument("--duration-s", type=float, default=120.0, help="slots start rollouts for this long, per run")
    ap.add_argument("--tasks", type=int, default=4, help="demo tasks (environments) used: the first N")
    ap.add_argument("--task", action="append", default=[], metavar="ID", help="these demo tasks instead")
    ap.add_argument("--pool-size", type=int, default=None,
                    help="warm sandboxes per environment (pool mode; default slots / tasks: the first burst is warm too)")
    ap.add_argument("--harness", default="codex", choices=["codex", "claude_code", "opencode"])
    ap.add_argument("--modes", nargs="+", default=["pool"], choices=["cold", "pool"],
                    help="farm modes; the last is stepped and reported")
    ap.add_argument("--baseline", default="bare", choices=["bare", "none"], help="the bare CLIs beside farm")
    ap.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",") if x] if s != "none" else [],
                    default=[8, 16, 24, 32, 48, 64], help="slot counts stepped for capacity_at_90 ('none': --n only)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a farm config override for the farm runs (e.g. grading.probe=false)")
    ap.add_argument("--quick", action="store_true",
                    help="the suite's size: 1 slot, 1 s turns, one rollout each way, no stepping (a check that it runs)")
    a = ap.parse_args()
    if a.quick:  # one rollout each way, of a task whose grading is quick
        a.n, a.turn_s, a.duration_s, a.steps = 1, 1.0, 5.0, []
        a.task = a.task or ["demo-lrucache"]
    a.tasks = len(a.task) or a.tasks
    asyncio.run(main(a))
    sys.stdout.flush()
    os._exit(0)  # leftover executor threads must not keep the process
