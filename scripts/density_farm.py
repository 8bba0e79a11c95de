"""The farm side of ``bench_density.py``: one sandbox actor's rollout path in this process
(``ActorLayers`` + ``RolloutPipeline``, without Ray: what a ``SandboxActor`` runs), its
figures and its CPU by owner (``density_ledger``)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from density_ledger import OWNER, NodeLedger
from density_slots import finished_per_min, occupancy, pct, slots
from farm.config import FarmConfig, load_config
from farm.grading import grading_spec
from farm.rollout.actor_layers import ActorLayers
from farm.rollout.model import RolloutSpec
from farm.rollout.pipeline import RolloutPipeline
from farm.sandboxes.base import SandboxSpec
from farm.tasks.loaders import load_tasks

MB = 1024 * 1024
FARM_OWNERS = ("farm.process", "agent.farm_cmds", "agent.jail", "grading.own_cmds", "grading.jail",
               "agent.between_commands", "grading.between_commands", "pool.between_commands", "pool.idle")


def config(args: argparse.Namespace, work: Path, pool: bool, n: int) -> FarmConfig:
    return load_config(None, [
        f"run_id=density-{'pool' if pool else 'cold'}-{n}",
        "tasks.path=demo",
        f"harness.name={args.harness}",
        "engine.mode=simulator", "engine.policy=oracle", "engine.tokenizer=builtin:farm-test",
        "engine.tool_parser=hermes",
        f"sandbox.local.base_dir={work / 'sandboxes'}",
        # live sandboxes: every rollout's own, the grading ones, the pool's
        f"rollout.sandbox_create_concurrency={2 * n + 8 * pool_size(args, n) + 8}",
        f"rollout.sandbox_create_rate={max(4.0, n / 2)}",
        f"rollout.concurrency={n}", f"rollout.max_turns={30 + args.reads}", "rollout.timeout_s=900",
        f"sandbox.pool.size={pool_size(args, n) if pool else 0}",
        f"sandbox.pool.max_environments={2 * args.tasks}",  # agent + grading spec per environment
        "sandbox.pool.refill_concurrency=2",
        "artifacts.enabled=false",
        *([f"engine.tokenizer_cache_dir={args.cache_dir}"] if args.cache_dir else []),
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


class LoopLag:
    """How late farm's event loop wakes a timer (every ``period`` s): what every await on a
    child's exit, a pipe or a socket waits beyond its own work when callbacks queue up."""

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.late_s: list[float] = []

    async def run(self, stop: asyncio.Event) -> None:
        # (its own CPU, ten task steps a second, stays in farm's process figure: ~0.1 ms a second)
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            t = loop.time()
            await asyncio.sleep(self.period)
            self.late_s.append(loop.time() - t - self.period)

    def figures(self) -> dict[str, float]:
        return {f"loop_lag_{q}_ms": round(1000 * pct(self.late_s, v), 1) for q, v in (("p50", 0.5), ("p95", 0.95))} | {
            "loop_lag_max_ms": round(1000 * max(self.late_s, default=float("nan")), 1)}


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
    lag = LoopLag()
    await ledger.loop_cpu.calibrate()
    ledger.start()
    lagging = asyncio.ensure_future(lag.run(stop))
    records, t0, t1 = await slots(n, args.duration_s, one, args.stagger_s)
    stop.set()
    await sampling
    await lagging
    led = await ledger.stop(exclude_s=sampler.cpu_s)
    pool_stats = vars(parts.pool.stats).copy()
    pieces = getattr(parts.gateway.renderer, "pieces", None)  # whole renders' pieces kept (farm.gateway.pieces)
    await parts.stop()
    out = summarize_farm(records, n, t0, t1, sampler, base_rss)
    out.update(lag.figures())
    out.update(cpu_report(led, out["rollouts"], out["turns"]))
    out["pool"] = pool_stats
    if pieces is not None:
        out["render_pieces_hits"] = f"{pieces.hits}/{pieces.hits + pieces.misses}"
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
        "in_flight": in_flight, "slot_utilization": util, "rollouts_per_min": finished_per_min(records, t0, t1),
        "overhead_p50_s": round(pct(overheads, 0.5), 2), "overhead_p95_s": round(pct(overheads, 0.95), 2),
        "rss_mb_per_rollout": round(farm_mb + cli_mb, 1), "create_p50_ms": round(pct(creates, 0.5), 1),
        "cli_mb": round(cli_mb, 1), "farm_mb": round(farm_mb, 1), "rollouts": len(records), "turns": turns,
        "resolved": sum(1 for r in records if r["result"].reward >= 1.0),  # as bare's: the task's tests passed
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
    # the turn's own path (the gateway: its callbacks, render and fidelity jobs, the tokenizer's
    # threads) against what a rollout pays once whatever its turns (its sandboxes, workspace,
    # CLI start, capture, grade; the loop's own work counted here): a demo rollout has 4 turns,
    # a real one 20-50, so the once-a-rollout part weighs 5-12 times more per turn here
    process = owners.get("farm.process", 0.0)
    turn_path = sum(led.farm_detail.get(k, 0.0) for k in ("gateway", "threads.native"))
    return {
        "farm_cpu_ms_per_turn": round(1000 * process / max(1, turns), 1),
        "farm_turn_path_ms_per_turn": round(1000 * turn_path / max(1, turns), 1),
        "farm_once_ms_per_rollout": round(1000 * (process - turn_path) / max(1, rollouts), 1),
        "farm_cpu_share": round(farm / node, 3) if node else float("nan"),
        "cpu_s_per_rollout": {k: round(v, 3) for k, v in led.per(rollouts).items() if abs(v) >= 0.0005},
        "grading_own_cpu_s_per_rollout": round(grade_own / max(1, rollouts), 3),
        "farm_ms_per_turn_by_owner": per_turn(led.farm_detail),
        "farm_thread_jobs_ms_per_turn": per_turn(led.farm_threads),
        "farm_callbacks_ms_per_turn": dict(list(per_turn(led.farm_callbacks).items())[:20]),
        "farm_commands_ms_per_rollout": {k: round(1000 * v / max(1, rollouts), 1) for k, v in
                                         sorted(led.farm_commands.items(), key=lambda kv: -kv[1])[:12]},
        "jailed_commands_per_rollout": round(led.jailed_commands / max(1, rollouts), 1),
        "overlapped_commands": led.overlapped,
        "unsampled_commands": led.unsampled,
        "uncounted_sandboxes": led.uncounted_sandboxes,
        "ledger_cpu_s": round(led.ledger_overhead_s, 2),  # the accounting's own, left out of farm's
    }


async def prepared_trees(cfg: FarmConfig, args: argparse.Namespace, url: str) -> tuple[dict, list, dict]:
    """Each task's environment (built now if it is not yet: before any clock), the tree a bare
    rollout copies, and the task's interpreter's PATH prefix."""
    parts = ActorLayers(cfg, url)
    await parts.start()
    try:
        tasks = pick_tasks(cfg, args)
        # each environment's view and interpreter as a farm sandbox gets them: bare's too (the
        # interpreter's pytest plugin caches written, farm.tasks.pycache), whichever runs first
        trees = {t.id: (await parts.runtime.sandbox_spec(t, SandboxSpec())).view for t in tasks}
        prefixes = {t.id: parts.runtime.path_prefix_for(t) or "" for t in tasks}
    finally:
        await parts.stop()
    return trees, tasks, prefixes
