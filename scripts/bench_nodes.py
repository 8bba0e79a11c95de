#!/usr/bin/env python
"""Scale-out benchmark (not a test): the same rollouts on 1 sandbox node vs 3, then on 3
with one killed mid-run, in one process on one multi-node Ray cluster.

The cluster (``tests/farm/farm_multinode.py``, ``ray.cluster_utils.Cluster``): a head
(the driver, the reducer, ``engine_node``: the router and the scripted workers) and 3
worker nodes (``sandbox_node``, 1 logical CPU each, their own sandbox root); the first
worker also holds ``one_node``. Every run is ``run_batch`` (``farm run``'s code path)
with the real Claude Code CLI, local sandboxes, the demo tasks, the oracle policy, and
the scripted engine's latency model (``engine.simulator.latency.ttft_s`` per model call)
making rollouts wait on the "GPU", not on this machine's 2 cores:

* ``1 node``: ``placement.sandbox_resource: one_node`` (sandbox actors on the first worker only);
* ``3 nodes``: ``placement.sandbox_resource: sandbox_node``;
* ``node loss``: 3 nodes, the first seen with a rollout in flight killed (raylet and
  workers, no grace); it does not come back: the run reports its sandboxes as left
  behind, and ``farm reap`` on that node's root (what the report says to do) kills them.

Figures: ``speedup_3_over_1`` = rollout makespan on 1 node / on 3 nodes, the makespan
being last ``finished_at`` - first ``started_at`` in the rollouts table (the rollouts'
own time; starting the engine and actors is the same fixed cost in both and printed
apart as ``setup_s``). ``lost``: planned rollouts with no row, over all runs;
``duplicated``: rows beyond one per rollout id + Samples beyond the rows' ``num_samples``;
``node_loss_redispatched``: rollouts the node-loss run re-dispatched.
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``): 2 rollouts a run, one scripted worker, a short
first token, and no ``3 nodes`` run (the node-loss run goes the same way on the same 3 nodes):
``speedup_3_over_1`` and ``makespan_3`` are ``na``. What a lost node does to a run is checked
by ``tests/farm/test_farm_nodes.py``, not here.
Last line: ``bench_nodes: rollouts=… speedup_3_over_1=… lost=… duplicated=… node_loss_redispatched=…
makespan_1=… makespan_3=… node_loss_finished=… node_loss_lost_nodes=…``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _config(work: Path, name: str, resource: str, args: argparse.Namespace):
    from farm.config import FarmConfig

    return FarmConfig.model_validate({
        "run_id": name,
        "tasks": {"path": "demo"},
        "harness": {"name": "claude_code"},
        "engine": {"mode": "simulator", "policy": "oracle",
                   "simulator": {"workers": args.workers, "latency": {"ttft_s": args.ttft_s}}},
        "sandbox": {"local": {"base_dir": str(work / "sb" / "$FARM_NODE_NAME")}},
        "rollout": {"n_samples": 2, "limit": args.rollouts, "concurrency": args.concurrency, "timeout_s": 600},
        "placement": {"sandbox_resource": resource, "engine_resource": "engine_node", "watch_nodes_s": 0},
        "ray": {"reducer_flush_s": 0.5},
        "output": {"dir": str(work / "out" / name)},
    })


def _check(out: Path, planned: int) -> dict:
    from farm.output.writer import ROLLOUTS_TABLE, SAMPLES_TABLE
    from farm.output.shard_reader import ShardReader

    rows = ShardReader(out, name=ROLLOUTS_TABLE).read_table().to_pylist()
    samples = ShardReader(out, name=SAMPLES_TABLE).read_table().column("rollout_id").to_pylist()
    ids = Counter(r["rollout_id"] for r in rows)
    expected = Counter(r["rollout_id"] for r in rows for _ in range(r["num_samples"]))
    dup = sum(n - 1 for n in ids.values()) + sum((Counter(samples) - expected).values())
    return {
        "rows": rows,
        "lost": planned - len(ids) + sum((expected - Counter(samples)).values()),
        "duplicated": dup,
        "makespan": max(r["finished_at"] for r in rows) - min(r["started_at"] for r in rows),
        "by_status": Counter(r["status"] for r in rows),
        "nodes": len({r["node"] for r in rows}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=12, help="rollouts per run (demo tasks x 2 samples)")
    ap.add_argument("--concurrency", type=int, default=2, help="rollouts in flight per sandbox node")
    ap.add_argument("--ttft-s", type=float, default=10.0, help="scripted engine: seconds before each model reply")
    ap.add_argument("--workers", type=int, default=2, help="scripted engine workers behind the router")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    if args.quick:  # one rollout a node at a time, two a run (the 1-node run's are one after the other)
        args.rollouts, args.concurrency, args.ttft_s, args.workers = 2, 1, 0.5, 1

    sys.path.insert(0, str(ROOT / "tests" / "farm"))
    from rich.console import Console

    from farm.run.batch import run_batch
    from farm_multinode import MultiNode

    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="bench-nodes-"))
    cluster = MultiNode(0)
    for i in range(3):
        cluster.add(f"w{i}", {"sandbox_node": 1, **({"one_node": 1} if i == 0 else {})})
    cluster.connect()
    results = {}
    try:
        phases = [("one", "one_node")] + ([] if args.quick else [("three", "sandbox_node")])
        for name, resource in phases:
            t0 = time.perf_counter()
            summary = run_batch(_config(work, name, resource, args), console=Console(quiet=True))
            res = _check(work / "out" / name, summary.planned)
            res["setup_s"] = (time.perf_counter() - t0) - res["makespan"]
            results[name] = (summary, res)
            print(f"{name:>5} node(s): {summary.finished} rollouts {dict(res['by_status'])} on {res['nodes']} node(s), "
                  f"makespan {res['makespan']:.1f} s (+{res['setup_s']:.1f} s setup), "
                  f"lost={res['lost']} duplicated={res['duplicated']}", flush=True)

        victim = ""  # the first worker node seen with a rollout in flight (not every node gets one)

        def kill_when_busy():
            nonlocal victim
            deadline = time.monotonic() + 300
            while not victim and time.monotonic() < deadline:
                busy = [p.parent.parent.name for p in (work / "sb").glob("w*/loss/*")]
                victim = busy[0] if busy else ""
                time.sleep(0.1)
            victim = victim or "w2"
            time.sleep(args.ttft_s)
            cluster.kill(victim)

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        summary = run_batch(_config(work, "loss", "sandbox_node", args), console=Console(quiet=True))
        killer.join(timeout=30)
        res = _check(work / "out" / "loss", summary.planned)
        results["loss"] = (summary, res)
        print(f" loss: {summary.finished} rollouts {dict(res['by_status'])}, re-dispatched {summary.redispatched}, "
              f"lost={res['lost']} duplicated={res['duplicated']}; lost nodes: {summary.lost_nodes}", flush=True)
        # What the report says to do on the node that did not come back.
        reap = subprocess.run(
            [sys.executable, "-m", "farm", "reap", "--run-id", "loss", "--backend", "local",
             "--set", f"sandbox.local.base_dir={work / 'sb' / '$FARM_NODE_NAME'}"],
            env={**os.environ, "FARM_NODE_NAME": victim}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        print(f" farm reap on {victim}: {reap.stderr.strip().splitlines()[-1] if reap.stderr.strip() else reap.returncode}")
    finally:
        cluster.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    one = results["one"][1]
    three = results["three"][1] if "three" in results else None
    speedup = f"{one['makespan'] / three['makespan']:.2f}" if three else "na"
    makespan_3 = f"{three['makespan']:.1f}" if three else "na"
    lost = sum(r[1]["lost"] for r in results.values())
    duplicated = sum(r[1]["duplicated"] for r in results.values())
    print(f"runtime {time.perf_counter() - t_start:.0f} s; ttft_s={args.ttft_s} concurrency={args.concurrency}/node")
    print(f"bench_nodes: rollouts={results['one'][0].finished} speedup_3_over_1={speedup} lost={lost} "
          f"duplicated={duplicated} node_loss_redispatched={results['loss'][0].redispatched} "
          f"makespan_1={one['makespan']:.1f} makespan_3={makespan_3} "
          f"node_loss_finished={results['loss'][0].finished} node_loss_lost_nodes={len(results['loss'][0].lost_nodes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
