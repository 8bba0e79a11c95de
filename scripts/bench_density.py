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
A demo rollout has 4 model turns; ``--reads N`` gives each N more (the oracle reads code
first), for the length of a real agent's rollout.

``--n`` slots run rollouts back to back for ``--duration-s`` (then finish what runs), on
``--tasks`` demo tasks (one environment each, built before the clock starts). The slots' first
starts are spread over ``--stagger-s`` (default one rollout's model time) and the window opens
once the last has started: a long run's slots are spread over a rollout's length (rollouts of
different lengths drift apart), while slots started together end together, round after round
(4 turns of 10 s +-20 % drift apart by a few seconds a round), and put every rollout's capture,
grading and test command on the cores at the same moment; ``--stagger-s 0`` measures that. The capacity
is found by stepping the slots (``--steps``, and ``--n``): at each step farm and bare run
one after the other in this process; ``capacity_at_90`` is the most slots at which
``slot_utilization`` >= 0.9 (stepping stops for a mode after its first step below; the gap
between its last step above and that one is then halved down to ``--resolution`` slots).
``--modes``: farm ``cold`` (every sandbox created when asked) and/or ``pool``
(``sandbox.pool``); the last one listed is the one stepped and on the last line.

Figures per run:

- ``in_flight``: rollouts running at once, time-averaged over the window;
- ``slot_utilization``: the fraction of slot time the agent runs (the phase a GPU engine
  serves), over the window;
- ``rollouts_per_min``: rollouts delivered per minute, each counted by the share of its run
  inside the window (an agent phase a saturated node stretches still counts as busy above;
  here a longer rollout is less delivered);
- ``loop_lag_p50_ms`` / ``p95`` / ``max`` (farm): how late farm's event loop wakes a 0.1 s
  timer: every await on a child's exit, a pipe or a socket of every rollout waits that long
  beyond its own work when the node's cores are taken;
- ``overhead_p50_s`` / ``overhead_p95_s``: per rollout, total minus the agent phase minus
  the test command (farm: create, prepare, session, capture, grading's own work; bare: the
  tree's copy);
- ``farm_cpu_ms_per_turn``: this process's CPU (gateway, pipeline, sandbox management; not
  the engine, the CLIs, or the bench's own samplers) per model turn; split into
  ``farm_turn_path_ms_per_turn`` (the gateway's: what every model turn costs) and
  ``farm_once_ms_per_rollout`` (the rest: what a rollout pays once, whatever its turns);
- the node's CPU by owner (``density_ledger``: cgroups per sandbox, ``/proc`` per process),
  per rollout and (farm's process) per turn by what ran it;
- ``farm_cpu_share``: farm's own CPU (its process, the jails, its commands in the sandboxes:
  workspace, capture, grading's own) over the node's, the engine stand-in left out (a real
  engine runs on its GPU nodes);
- ``rss_mb_per_rollout`` (``cli_mb`` PSS of the sandboxes' processes + ``farm_mb``), ``create_p50_ms``.

Last line: ``bench_density: in_flight=… slot_utilization=… overhead_p50_s=…
farm_cpu_ms_per_turn=… capacity_at_90=… bare_capacity_at_90=… capacity_ratio=…
farm_cpu_share=… farm_turn_path_ms_per_turn=… farm_once_ms_per_rollout=…`` (the farm figures
from its run at ``--n``). Defaults are the issue's measurement (16 slots, 10 s turns, 120 s,
pool, bare baseline, steps 8..64 then halved to 4 slots: ~50 min), the slots' starts spread;
``--quick`` is the suite's size (1 task, 2 slots, 1 s turns: a check that it runs).
Before it, ``bench_density[delivered]``: the most rollouts a minute each delivered over its runs,
and their ratio; a capacity that held at the last step is said to be a lower bound. Past a
node's knee the utilization falls only where the waiting lands outside the agent phase (farm's
grading; bare's is almost all agent phase, which counts as busy however stretched), so the
delivered ratio is the firmer comparison there.
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

from density_bare import BareRollouts, served_turns, start_endpoint
from density_farm import config, prepared_trees, run_farm
from density_ledger import tree_s
from density_slots import finished_per_min, narrow, occupancy, pct, slots
from farm.config import load_config
from farm.engine.config import LatencyConfig
from farm.engine.launchers import start_scripted_worker
from farm.harnesses import make_harness
from farm.modeltext.tokenizer import resolve_tokenizer
from farm.tasks.loaders import resolve_tasks_path


# ---- bare ----------------------------------------------------------------------------------------
async def run_bare(args: argparse.Namespace, work: Path, url: str, endpoint_pid: int, n: int,
                   trees: dict[str, Any], tasks: list[Any], prefixes: dict[str, str]) -> dict:
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

    records, t0, t1 = await slots(n, args.duration_s, one, args.stagger_s)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    turns = await served_turns(url) - turns0
    in_flight, util = occupancy(records, n, t0, t1)
    overheads = [r["end"] - r["start"] - r["result"]["timings"]["agent"] - r["result"]["timings"]["test"]
                 for r in records]
    marks = [r["result"]["timings"] for r in records]
    phases = {k: round(statistics.median(m[k] for m in marks), 3) for k in ("prep", "agent", "test")} if marks else {}
    owners = dict(bare.cpu)
    owners["engine"] = tree_s(endpoint_pid) - e0  # its protocol front included: the engine's own endpoint
    owners["bare.driver"] = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {
        "in_flight": in_flight, "slot_utilization": util, "rollouts_per_min": finished_per_min(records, t0, t1),
        "overhead_p50_s": round(pct(overheads, 0.5), 2), "overhead_p95_s": round(pct(overheads, 0.95), 2),
        "rollouts": len(records), "turns": turns, "phases_p50_s": phases,
        "resolved": sum(1 for r in records if r["result"]["resolved"]),
        "reasons": {"unresolved": why} if (why := next((r["result"]["why"] for r in records if r["result"]["why"]), ""))
        else {},  # the first unresolved rollout's test log, as farm's run shows its first failure
        "cli_exit_codes": sorted({r["result"]["exit_code"] for r in records}),
        "cpu_s_per_rollout": {k: round(v / max(1, len(records)), 3) for k, v in sorted(owners.items())},
    }


# ---- the run ---------------------------------------------------------------------------------------
def show(label: str, r: dict) -> None:
    nested = ("statuses", "reasons", "pool", "phases_p50_s", "cpu_s_per_rollout", "farm_ms_per_turn_by_owner",
              "farm_callbacks_ms_per_turn", "farm_thread_jobs_ms_per_turn", "farm_commands_ms_per_rollout")
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
             model_name=cfg.engine.model_name, latency=LatencyConfig(ttft_s=args.turn_s, jitter=0.2),
             oracle_reads=args.reads),
        log_dir=work, name="scripted-0", timeout=120)
    bare_proc = None
    farm_mode = args.modes[-1]
    results: dict[str, dict] = {}
    capacity: dict[str, int] = {}
    delivered: dict[str, float] = {}  # each one's most rollouts a minute over its runs
    try:
        if args.baseline == "bare":
            bare_proc, bare_url = await start_endpoint(tokenizer=tokenizer, tasks_path=tasks_path, turn_s=args.turn_s,
                                                       model_name=cfg.engine.model_name, work=work, reads=args.reads)
            trees, tasks, prefixes = await prepared_trees(cfg, args, url)
        for mode in args.modes[:-1]:  # the other farm modes, at --n only
            results[mode] = await run_farm(args, work, url, proc.pid or 0, mode == "pool", args.n)
            show(f"{mode} n={args.n}", results[mode])
        async def step(who: str, n: int) -> bool:
            """One run of ``who`` at ``n`` slots; True when it keeps >= 0.9 of its slots busy."""
            if who == "farm":
                r = await run_farm(args, work, url, proc.pid or 0, farm_mode == "pool", n)
                show(f"{farm_mode} n={n}", r)
                if n == args.n:
                    results[farm_mode] = r
            else:
                r = await run_bare(args, work, bare_url, bare_proc.pid, n, trees, tasks, prefixes)
                show(f"bare n={n}", r)
            delivered[who] = max(delivered.get(who, 0.0), r["rollouts_per_min"])
            return r["slot_utilization"] >= 0.9

        steps = sorted({*args.steps, args.n})
        going = {"farm": True, "bare": args.baseline == "bare"}
        failed: dict[str, int] = {}  # each one's first step below 0.9
        for n in steps:
            if n > args.n and not any(going.values()):
                break
            for who in ("farm", "bare"):
                if going[who] or (who == "farm" and n == args.n):
                    ok = await step(who, n)
                    if going[who] and not ok:
                        failed[who] = n
                    going[who] = going[who] and ok
                    capacity[who] = n if going[who] else capacity.get(who, 0)
        await narrow(capacity, failed, args.resolution, step)  # the gaps the steps left, halved
    finally:
        await proc.astop()
        if bare_proc is not None and bare_proc.returncode is None:
            bare_proc.kill()
            await bare_proc.wait()
    final = results[farm_mode]
    if args.baseline == "bare" and delivered.get("bare"):
        # past its knee a node delivers no more whatever the slots (a saturated node's waiting
        # lands in the agent phase, counted busy, or in the grading, counted idle): the most
        # each delivered is the other measure of what a node holds
        print(f"bench_density[delivered]: farm_max_rollouts_per_min={delivered.get('farm', 0.0)} "
              f"bare_max_rollouts_per_min={delivered['bare']} "
              f"ratio={round(delivered.get('farm', 0.0) / delivered['bare'], 2)}", flush=True)
    for who in ("farm", "bare"):
        if len(steps) > 1 and who in capacity and who not in failed and capacity[who] == max(steps):
            print(f"bench_density[{who}]: kept >= 0.9 at the last step ({capacity[who]} slots): its capacity is at "
                  f"least that (--steps for more)", flush=True)
    cap, bare_cap = capacity.get("farm", 0), capacity.get("bare", 0)
    ratio = round(cap / bare_cap, 2) if bare_cap else float("nan")
    line = {k: final[k] for k in ("in_flight", "slot_utilization", "overhead_p50_s", "farm_cpu_ms_per_turn")}
    line.update(capacity_at_90=cap, bare_capacity_at_90=bare_cap if args.baseline == "bare" else "nan",
                capacity_ratio=ratio, farm_cpu_share=final["farm_cpu_share"],
                farm_turn_path_ms_per_turn=final["farm_turn_path_ms_per_turn"],
                farm_once_ms_per_rollout=final["farm_once_ms_per_rollout"])
    print("bench_density: " + " ".join(f"{k}={v}" for k, v in line.items()), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=16, help="slots of the farm run the last line reports")
    ap.add_argument("--turn-s", type=float, default=10.0, help="model time per turn (the worker's ttft)")
    ap.add_argument("--duration-s", type=float, default=120.0, help="slots start rollouts for this long, per run")
    ap.add_argument("--reads", type=int, default=0, metavar="N",
                    help="N more model turns a rollout (the oracle reads code before its fix): a demo rollout has "
                         "4 turns, a real agent's 20-50; what a rollout pays once weighs on fewer turns here")
    ap.add_argument("--stagger-s", type=float, default=None,
                    help="spread the slots' first starts over this many seconds, the window opening once the last "
                         "has started (default: a rollout's model time, (4 + reads) x turn-s: the slots as a long "
                         "run holds them; 0: all at once, every round's grading meeting on the cores)")
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
    ap.add_argument("--resolution", type=int, default=4,
                    help="after stepping, halve the gap between the last step kept busy and the first not, down "
                         "to this many slots (farm and bare alike; 0: the steps alone)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a farm config override for the farm runs (e.g. grading.probe=false)")
    ap.add_argument("--cache-dir", default=None, help="where builtin tokenizers are built (engine.tokenizer_cache_dir)")
    ap.add_argument("--quick", action="store_true",
                    help="the suite's size: 1 slot, 1 s turns, one rollout each way, no stepping (a check that it runs)")
    a = ap.parse_args()
    if a.quick:  # one rollout each way, of a task whose grading is quick
        a.n, a.turn_s, a.duration_s, a.steps = 1, 1.0, 5.0, []
        a.task = a.task or ["demo-lrucache"]
    a.tasks = len(a.task) or a.tasks
    if a.stagger_s is None:
        a.stagger_s = (4 + a.reads) * a.turn_s
    asyncio.run(main(a))
    sys.stdout.flush()
    os._exit(0)  # leftover executor threads must not keep the process
