#!/usr/bin/env python
"""A node full of rollouts: how many one node keeps in flight and busy, and what each costs.

One sandbox actor's rollout path (``ActorLayers`` + ``RolloutPipeline``, in this process,
without Ray: what a ``SandboxActor`` runs), real local sandboxes (bubblewrap, cgroups,
copy-on-write views of the environment snapshots), a real CLI (``--harness``, default
Codex), graded in fresh sandboxes; the model is the scripted oracle worker (its own
process) with a realistic per-turn latency: ``engine.simulator.latency.ttft_s`` = the
turn time (``--turn-s``, +-20 % jitter), as a GPU engine's turn takes seconds.

``--n`` slots run rollouts back to back for ``--duration-s`` (then finish what runs), on
``--tasks`` demo tasks (one environment each, built before the clock starts), twice in
this process, side by side:

- ``cold``: today's path: every agent and grading sandbox created when the rollout asks;
- ``pool``: ``sandbox.pool`` on (``--pool-size`` warm sandboxes per environment).

Figures (per mode; the last line is the pool's):

- ``in_flight``: rollouts running at once, time-averaged over the window;
- ``slot_utilization``: the fraction of slot time the agent runs (the phase a GPU engine
  serves), over the window;
- ``overhead_p50_s`` / ``overhead_p95_s``: per rollout, total minus the agent phase minus
  the grader's test command (create, prepare, session, capture, grading's own work);
- ``farm_cpu_ms_per_turn``: this process's CPU (gateway, pipeline, sandbox management;
  not the engine, not the CLIs, not the bench's own memory sampling) per model turn;
- ``rss_mb_per_rollout``: ``cli_mb`` (PSS of every process in the sandboxes: the CLIs,
  their jails and tools) + ``farm_mb`` (this process's RSS growth), per rollout in flight,
  median over the samples taken every 3 s;
- ``create_p50_ms``: the create_sandbox phase of the agent sandboxes (pool: an acquire).

Last line: ``bench_density: in_flight=… slot_utilization=… overhead_p50_s=… overhead_p95_s=…
farm_cpu_ms_per_turn=… rss_mb_per_rollout=… create_p50_ms=…``. Full size (the target a
node is sized for: in_flight >= 64 with slot_utilization >= 0.9 at a 10 s turn, overhead p50 <= 0.5 s,
create_p50_ms <= 50 with the pool): ``--n 64 --turn-s 10``; ``--quick`` for development.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from farm.config import FarmConfig, load_config
from farm.engine.launchers import start_scripted_worker
from farm.grading import grading_spec
from farm.modeltext.tokenizer import resolve_tokenizer
from farm.rollout.model import RolloutSpec
from farm.rollout.actor_layers import ActorLayers
from farm.rollout.pipeline import RolloutPipeline
from farm.sandboxes.base import SandboxSpec
from farm.tasks.loaders import load_tasks, resolve_tasks_path

MB = 1024 * 1024


def config(args: argparse.Namespace, work: Path, pool: bool) -> FarmConfig:
    n = args.n
    return load_config(None, [
        f"run_id=density-{'pool' if pool else 'cold'}",
        "tasks.path=demo",
        f"harness.name={args.harness}",
        "engine.mode=simulator", "engine.policy=oracle", "engine.tokenizer=builtin:farm-test",
        "engine.tool_parser=hermes",
        f"sandbox.local.base_dir={work / 'sandboxes'}",
        # live sandboxes: every rollout's own, the grading ones, the pool's
        f"rollout.sandbox_create_concurrency={2 * n + 8 * args.pool_size + 8}",
        f"rollout.sandbox_create_rate={max(4.0, n / 2)}",
        f"rollout.concurrency={n}", "rollout.max_turns=30", "rollout.timeout_s=900",
        f"sandbox.pool.size={args.pool_size if pool else 0}",
        f"sandbox.pool.max_environments={2 * args.tasks}",  # agent + grading spec per environment
        "sandbox.pool.refill_concurrency=2",
        "artifacts.enabled=false",
    ])


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
            return self._sandbox_pss()
        finally:
            self.cpu_s += time.thread_time() - t0

    def _sandbox_pss(self) -> float:
        total = 0.0
        for child in self.me.children(recursive=True):
            try:
                if child.pid == self.engine_pid or child.ppid() == self.engine_pid:
                    continue
                total += child.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return total

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


async def run_mode(args: argparse.Namespace, work: Path, engine_url: str, engine_pid: int, pool: bool) -> dict:
    cfg = config(args, work, pool)
    tasks = load_tasks(cfg.tasks).tasks[: args.tasks]
    parts = ActorLayers(cfg, engine_url)
    await parts.start()
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
            while parts.pool.idle < 2 * args.pool_size * len(tasks):
                await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)
    sampler = Sampler(engine_pid)
    base_rss = sampler.me.memory_info().rss
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    deadline = t0 + args.duration_s
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)

    async def slot(i: int) -> None:
        k = 0
        while time.monotonic() < deadline:
            task = tasks[(i + k) % len(tasks)]
            phases: list[tuple[str, float]] = []
            spec = _spec(cfg, task, f"s{i}-{k}")
            start = time.monotonic()
            result = await pipeline.run(spec, lambda kind, d: phases.append((d["phase"], time.monotonic()))
                                        if kind == "phase" else None)
            end = time.monotonic()
            records.append({"start": start, "end": end, "phases": phases, "result": result})
            k += 1

    stop = asyncio.Event()
    sampling = asyncio.ensure_future(sampler.run(stop))
    await asyncio.gather(*(slot(i) for i in range(args.n)))
    stop.set()
    await sampling
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    ch1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    pool_stats = vars(parts.pool.stats).copy()
    await parts.stop()
    return summarize(args, records, sampler, base_rss, t0, deadline,
                     farm_cpu=(cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime) - sampler.cpu_s,
                     child_cpu=(ch1.ru_utime + ch1.ru_stime) - (ch0.ru_utime + ch0.ru_stime), pool_stats=pool_stats)


def _spec(cfg: FarmConfig, task: Any, rid: str) -> RolloutSpec:
    return RolloutSpec(run_id=cfg.run_id, rollout_id=rid, group_id=task.id, sample_index=0, task=task)


def summarize(args, records, sampler, base_rss, t0, t1, *, farm_cpu, child_cpu, pool_stats) -> dict:
    window = t1 - t0
    running = sum(overlap(r["start"], r["end"], t0, t1) for r in records)
    busy = 0.0
    overheads, creates, turns, statuses = [], [], 0, {}
    phase_s: dict[str, list[float]] = {}
    reasons: dict[str, str] = {}
    for r in records:
        res = r["result"]
        statuses[res.status.value] = statuses.get(res.status.value, 0) + 1
        if res.status.value != "completed":
            reasons.setdefault(res.status.value, res.reason[:300])
        marks = r["phases"] + [("end", r["end"])]
        for (name, a), (_, b) in zip(marks, marks[1:]):
            if name == "agent":
                busy += overlap(a, b, t0, t1)
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
    steady = [(rss, pss) for t, rss, pss in sampler.samples if t0 + 0.2 * window <= t <= t1]
    in_flight = running / window
    farm_mb = statistics.median([(rss - base_rss) / MB for rss, _ in steady]) / in_flight if steady else float("nan")
    cli_mb = statistics.median([pss / MB for _, pss in steady]) / in_flight if steady else float("nan")
    return {
        "in_flight": round(in_flight, 1),
        "slot_utilization": round(busy / (args.n * window), 3),
        "overhead_p50_s": round(pct(overheads, 0.5), 2),
        "overhead_p95_s": round(pct(overheads, 0.95), 2),
        "farm_cpu_ms_per_turn": round(1000 * farm_cpu / max(1, turns), 1),
        "rss_mb_per_rollout": round(farm_mb + cli_mb, 1),
        "create_p50_ms": round(pct(creates, 0.5), 1),
        "cli_mb": round(cli_mb, 1),
        "farm_mb": round(farm_mb, 1),
        "rollouts": len(records),
        "turns": turns,
        "children_cpu_s_per_rollout": round(child_cpu / max(1, len(records)), 2),
        "sampler_cpu_s": round(sampler.cpu_s, 2),  # the bench's own PSS sampling, left out of farm's
        "statuses": statuses,
        "reasons": reasons,
        "pool": pool_stats,
        "phases_p50_s": {k: round(statistics.median(v), 3) for k, v in phase_s.items()},
    }


LAST = ["in_flight", "slot_utilization", "overhead_p50_s", "overhead_p95_s", "farm_cpu_ms_per_turn",
        "rss_mb_per_rollout", "create_p50_ms"]


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-density-"))
    cfg = config(args, work, False)
    tasks_path = str(resolve_tasks_path(cfg.tasks))
    tokenizer = resolve_tokenizer(cfg.engine.tokenizer, cfg.engine.tokenizer_cache_dir)
    from farm.engine.config import LatencyConfig

    proc, url = await start_scripted_worker(
        dict(policy="oracle", tokenizer=tokenizer, tasks_path=tasks_path, tool_format="hermes",
             model_name=cfg.engine.model_name, latency=LatencyConfig(ttft_s=args.turn_s, jitter=0.2)),
        log_dir=work, name="scripted-0", timeout=120)
    results = {}
    try:
        for mode in args.modes:
            results[mode] = await run_mode(args, work, url, proc.pid or 0, mode == "pool")
            r = results[mode]
            print(f"bench_density[{mode}]: " + " ".join(f"{k}={v}" for k, v in r.items()
                                                          if k not in ("statuses", "reasons", "pool", "phases_p50_s")), flush=True)
            print(f"  statuses={r['statuses']} pool={r['pool']}\n  reasons={r['reasons']}\n  phases_p50_s={r['phases_p50_s']}", flush=True)
    finally:
        await proc.astop()
    final = results.get("pool") or results[args.modes[-1]]
    print("bench_density: " + " ".join(f"{k}={final[k]}" for k in LAST))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64, help="rollouts in flight (slots)")
    ap.add_argument("--turn-s", type=float, default=10.0, help="model time per turn (the worker's ttft)")
    ap.add_argument("--duration-s", type=float, default=180.0, help="slots start rollouts for this long")
    ap.add_argument("--tasks", type=int, default=4, help="demo tasks (environments) used")
    ap.add_argument("--pool-size", type=int, default=None,
                    help="warm sandboxes per environment (pool mode; default n / tasks: the first burst is warm too)")
    ap.add_argument("--harness", default="codex", choices=["codex", "claude_code", "opencode"])
    ap.add_argument("--modes", nargs="+", default=["cold", "pool"], choices=["cold", "pool"])
    ap.add_argument("--quick", action="store_true", help="a development size: 8 slots, 2 s turns, 40 s")
    a = ap.parse_args()
    if a.quick:
        a.n, a.turn_s, a.duration_s, a.tasks = 8, 2.0, 40.0, 2
    if a.pool_size is None:
        a.pool_size = -(-a.n // a.tasks)
    asyncio.run(main(a))
    sys.stdout.flush()
    os._exit(0)  # leftover executor threads must not keep the process
