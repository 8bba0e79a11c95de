#!/usr/bin/env python
"""Environment snapshots vs setup per sandbox, side by side in one process.

The task: a real SWE-bench-format row built from a PyPI sdist (``farm.testing.sdist_task``),
whose recipe installs real wheels into a venv (numpy, pandas, scipy, pytest: ~20 s of pip
here). A group of ``--n`` rollouts, ``farm run`` in this process (real Ray, real Claude
Code, the scripted oracle engine behind the real router, local sandboxes), twice:

- ``setup``: ``envs.enabled: false``: every agent sandbox and every grading sandbox
  materializes the repository and runs the setup (today's way before snapshots);
- ``snapshot``: the environment is built once (timed: ``build_s``), then every sandbox
  starts from a private copy-on-write view of it.

Also: the same environment built with uv instead of pip (``uv_build_s`` vs
``pip_build_s``), and the view itself made each way (``overlay`` mount vs ``copy``).

Figures: ``ready_*``: a sandbox from create to a ready workspace (agent: create +
prepare phases; grading: its prepare), snapshot run; ``group8_speedup``: setup run's
wall time / (build + snapshot run's wall time); ``rollout_disk_mb``: the largest agent
sandbox directory after its rollout; ``changed_mb``: the workspace files that rollout
changed (its overlay upper layer's workspace part).

Last line: ``bench_envs: build_s=… ready_p50_s=… ready_p95_s=… group8_speedup=…
rollout_disk_mb=… snapshot_mb=… …``. Targets: ready_p50_s <= 1.0, group8_speedup >= 4,
rollout_disk_mb <= changed_mb + 20.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
from rich.console import Console

from farm.config import FarmConfig
from farm.driver import run_farm
from farm.envs.provider import EnvProvider
from farm.rollout.store import ROLLOUTS_TABLE
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.views import mount_view, unmount_under
from farm.sandboxes.watchdog import disk_usage
from farm.tasks.loaders import load_tasks
from farm.tasks.runtime import TaskRuntime
from farm.testing.sdist_task import make_task_set
from farm.trajectory.reader import ShardReader

DEPS = ["numpy", "pandas", "scipy"]
MB = 1024 * 1024


def config(root: Path, tasks: dict, mode: str, n: int, harness: str) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": f"bench-envs-{mode}",
        "tasks": {"path": str(tasks["tasks"]), "recipes": str(tasks["recipes"]), "mirror_dir": str(tasks["mirrors"])},
        "envs": {"enabled": mode == "snapshot", "cache_dir": str(root / "envs")},
        "harness": {"name": harness},
        "engine": {"mode": "scripted", "policy": "oracle"},
        "sandbox": {"local": {"base_dir": str(root / f"sb-{mode}")}},
        "rollout": {"n_samples": n, "concurrency": n, "timeout_s": 1800},
        "ray": {"num_sandbox_actors": 1, "reducer_flush_s": 0.5},
        "output": {"dir": str(root / f"out-{mode}")},
    })


def rows(out: Path) -> list[dict]:
    return ShardReader(out, name=ROLLOUTS_TABLE).read_table().to_pylist()


def ready_times(rs: list[dict]) -> list[float]:
    out = []
    for r in rs:
        t = json.loads(r["timings"])
        out.append(t.get("create_sandbox", 0.0) + t.get("prepare", 0.0))
        grading = json.loads(r["grading"] or "{}")
        if grading.get("timings", {}).get("prepare_s") is not None:
            out.append(grading["timings"]["prepare_s"])
    return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class DiskSampler(threading.Thread):
    """Polls every agent sandbox directory while the run goes on (sandboxes are removed
    when their rollout ends): the largest size each reached, and its upper layer's."""

    def __init__(self, base: Path) -> None:
        super().__init__(daemon=True)
        self.base, self.stop = base, threading.Event()
        self.disk: dict[str, int] = {}
        self.upper: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            for labels in self.base.glob("*/*/labels.json"):
                try:
                    if json.loads(labels.read_text())["labels"].get("purpose") != "agent":
                        continue
                except (OSError, ValueError):
                    continue
                d = labels.parent
                self.disk[d.name] = max(self.disk.get(d.name, 0), disk_usage(str(d)))
                self.upper[d.name] = max(self.upper.get(d.name, 0), disk_usage(str(d / "view" / "upper")))
            self.stop.wait(0.5)

    def __enter__(self) -> "DiskSampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()


async def build_once(cfg: FarmConfig, installer_tasks: dict) -> tuple[float, float]:
    """(build seconds, snapshot bytes) of the task's environment, with a fresh cache."""
    runtime = TaskRuntime.from_config(cfg.tasks.model_copy(update={
        "path": str(installer_tasks["tasks"]), "recipes": str(installer_tasks["recipes"]),
        "mirror_dir": str(installer_tasks["mirrors"])}))  # fmt: skip
    task = load_tasks(runtime.config).tasks[0]
    envs = EnvProvider(cfg.envs, runtime, lambda spec: create_sandbox(cfg.sandbox, spec))
    runtime.envs = envs
    t0 = time.monotonic()
    rec = await envs.ensure(task)
    if not rec.ok:
        sys.exit(f"bench_envs: the environment failed to build: {rec.reason}\n{rec.log_tail()}")
    return time.monotonic() - t0, float(rec.size_bytes)


def view_times(tree: Path, scratch: Path) -> dict[str, float]:
    out = {}
    for mode in ("overlay", "fuse-overlayfs", "copy"):
        d = scratch / f"view-{mode}"
        t0 = time.monotonic()
        mount_view(str(tree), d, mode)
        out[mode] = time.monotonic() - t0
        unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8, help="rollouts in the group")
    ap.add_argument("--harness", default="claude_code")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-envs-"))
    console = Console(stderr=True)
    try:
        pip_tasks = make_task_set(root / "task-pip", installer="pip", extra_deps=DEPS)
        uv_tasks = make_task_set(root / "task-uv", installer="uv", extra_deps=DEPS)
        ray.init(num_cpus=2, include_dashboard=False, namespace="farm", log_to_driver=False)

        walls, results = {}, {}
        cfg_setup = config(root, pip_tasks, "setup", args.n, args.harness)
        t0 = time.monotonic()
        with DiskSampler(root / "sb-setup") as setup_disk:
            summary = run_farm(cfg_setup, console=Console(quiet=True))
        walls["setup"] = time.monotonic() - t0
        results["setup"] = rows(root / "out-setup")
        console.print(f"setup per sandbox: {summary.by_status} in {walls['setup']:.1f} s")

        cfg_snap = config(root, pip_tasks, "snapshot", args.n, args.harness)
        build_s, snapshot_bytes = asyncio.run(build_once(cfg_snap, pip_tasks))
        console.print(f"snapshot built (pip) in {build_s:.1f} s, {snapshot_bytes / MB:.0f} MB")
        t0 = time.monotonic()
        with DiskSampler(root / "sb-snapshot") as snap_disk:
            summary = run_farm(cfg_snap, console=Console(quiet=True))
        walls["snapshot"] = time.monotonic() - t0
        results["snapshot"] = rows(root / "out-snapshot")
        console.print(f"from the snapshot: {summary.by_status} in {walls['snapshot']:.1f} s")

        uv_cfg = cfg_snap.model_copy(deep=True)
        uv_cfg.envs.cache_dir = str(root / "envs-uv")
        uv_build_s, _ = asyncio.run(build_once(uv_cfg, uv_tasks))
        console.print(f"the same environment built with uv: {uv_build_s:.1f} s")

        for mode, rs in results.items():
            bad = [r for r in rs if r["status"] != "completed" or r["reward"] != 1.0]
            if len(rs) != args.n or bad:
                sys.exit(f"bench_envs: {mode}: {len(rs)} rollouts, not all resolved: "
                         f"{[(r['status'], r['reason'][:200]) for r in bad]}")  # fmt: skip
        ready = ready_times(results["snapshot"])
        ready_setup = ready_times(results["setup"])
        name = max(snap_disk.disk, key=snap_disk.disk.__getitem__)
        disk, changed = snap_disk.disk[name], snap_disk.upper[name]
        base_disk = max(setup_disk.disk.values())
        tree = next((root / "envs").glob("*/tree"))
        views = view_times(tree, root)
        figures = {
            "build_s": build_s,
            "ready_p50_s": statistics.median(ready),
            "ready_p95_s": pct(ready, 0.95),
            "group8_speedup": walls["setup"] / (build_s + walls["snapshot"]),
            "rollout_disk_mb": disk / MB,
            "changed_mb": changed / MB,
            "snapshot_mb": snapshot_bytes / MB,
            "setup_ready_p50_s": statistics.median(ready_setup),
            "setup_rollout_disk_mb": base_disk / MB,
            "wall_setup_s": walls["setup"],
            "wall_snapshot_s": walls["snapshot"],
            "pip_build_s": build_s,
            "uv_build_s": uv_build_s,
            "view_overlay_s": views["overlay"],
            "view_fuse_s": views["fuse-overlayfs"],
            "view_copy_s": views["copy"],
        }
        print(f"bench_envs (n={args.n}, {args.harness}, deps: {' '.join(DEPS)}):", file=sys.stderr)
        print("bench_envs: " + " ".join(f"{k}={v:.3f}" if v < 10 else f"{k}={v:.1f}" for k, v in figures.items()))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if not args.keep:
            for mounted in (root,):
                unmount_under(mounted)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
