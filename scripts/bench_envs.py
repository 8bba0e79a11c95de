#!/usr/bin/env python
"""Environment snapshots vs setup per sandbox, side by side in one process.

The task: a real SWE-bench-format row built from a PyPI sdist (``tests/testkit/sdist_task.py``),
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

**Layered environments** (``--layers-only`` runs just this part): 8 instances of one
repository-version — inflection 0.5.1's sdist from PyPI as a git repository with 8 small
real commits on top (an irregular plural each), every commit an instance's base commit,
the last one its environment_setup_commit — with a recipe whose base installs real
packages with uv (pytest, setuptools, numpy, pandas, scipy into ``.venv``) and whose
per-instance setup installs the checkout editable. Built, with fresh caches, two ways:

- ``one_instance``: ONE instance the old way: one snapshot holding the checkout, the venv
  and the editable install (``one_instance_build_s``, ``one_instance_disk_mb``);
- ``layered``: all 8 the new way (``farm envs build``'s path, 8 at once): the base once,
  then a thin instance layer per commit (``layered_build_s``: the wall time of all of it;
  ``layered_disk_mb``: the base and the 8 layers).

Last line: ``bench_envs: build_s=… ready_p50_s=… ready_p95_s=… group8_speedup=…
rollout_disk_mb=… changed_mb=… snapshot_mb=… setup_ready_p50_s=… setup_rollout_disk_mb=…
wall_setup_s=… wall_snapshot_s=… pip_build_s=… uv_build_s=… view_overlay_s=… view_fuse_s=…
view_copy_s=… instances=8 layered_disk_mb=… one_instance_disk_mb=… layered_build_s=…
one_instance_build_s=…``. Targets: ready_p50_s <= 1.0, group8_speedup
>= 4, rollout_disk_mb <= changed_mb + 20; layered_disk_mb <= 1.5 x one_instance_disk_mb,
layered_build_s <= 1.5 x one_instance_build_s.
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``): one rollout a run, 2 instances, no packages but pytest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import ray
from rich.console import Console

from farm.config import FarmConfig
from farm.run.batch import run_batch
from farm.envs.provider import EnvProvider
from farm.envs.store import EnvRecord
from farm.output.writer import ROLLOUTS_TABLE
from farm.sandboxes.factory import create_sandbox
from farm.sandboxes.views import ViewLayer, mount_view, unmount_under
from farm.sandboxes.watchdog import disk_usage
from farm.tasks.loaders import load_tasks
from farm.tasks.model import GitSource, Task
from farm.tasks.runtime import TaskRuntime
from farm.output.shard_reader import ShardReader

# the row builder the tests use (tests/testkit: a test helper, not part of the farm package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from testkit.sdist_task import fetch_sdist, make_task_set  # noqa: E402

DEPS = ["numpy", "pandas", "scipy"]
MB = 1024 * 1024
INSTANCES = 8
PLURALS = [("cactus", "cacti"), ("focus", "foci"), ("fungus", "fungi"), ("nucleus", "nuclei"),
           ("radius", "radii"), ("stimulus", "stimuli"), ("syllabus", "syllabi"), ("alumnus", "alumni")]  # fmt: skip


def layer_base(deps: list[str]) -> list[str]:
    return ["uv venv -q .venv",  # bytecode compiled as pip does by default (uv does not): no rollout writes it
            f"uv pip install -q --compile-bytecode --python .venv/bin/python pytest setuptools {' '.join(deps)}"]

LAYER_SETUP = ["uv pip install -q --python .venv/bin/python --no-deps --no-build-isolation -e ."]


def config(root: Path, tasks: dict, mode: str, n: int, harness: str) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": f"bench-envs-{mode}",
        "tasks": {"path": str(tasks["tasks"]), "recipes": str(tasks["recipes"]), "mirror_dir": str(tasks["mirrors"])},
        "envs": {"enabled": mode == "snapshot", "cache_dir": str(root / "envs")},
        "harness": {"name": harness},
        "engine": {"mode": "simulator", "policy": "oracle"},
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


async def build_once(cfg: FarmConfig, installer_tasks: dict) -> tuple[float, float, tuple[ViewLayer, ...]]:
    """(build seconds, snapshot bytes, the layers a sandbox's view stacks) of the task's
    environment, with a fresh cache."""
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
    took = time.monotonic() - t0
    return took, float(rec.size_bytes), (await envs.view_for(task)).layers


def view_times(layers: tuple[ViewLayer, ...], scratch: Path) -> dict[str, float]:
    """Seconds to make a sandbox's view of the snapshot each way (the layers a rollout's view stacks)."""
    out = {}
    for mode in ("overlay", "fuse-overlayfs", "copy"):
        d = scratch / f"view-{mode}"
        t0 = time.monotonic()
        mount_view(layers, d, mode)
        out[mode] = time.monotonic() - t0
        unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)
    return out


def git(cwd: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


def eight_commits(root: Path, instances: int = INSTANCES) -> tuple[Path, list[str]]:
    """inflection's sdist as a repository, one commit per added irregular plural; returns
    (the mirrors dir, the ``instances`` commits)."""
    sdist = fetch_sdist(Path(os.path.expanduser("~/.cache/farm/testing/sdists")))
    with tarfile.open(sdist) as tar:
        tar.extractall(root / "unpacked", filter="data")
    work = root / "unpacked" / "inflection-0.5.1"
    git(work, "init", "-q", "-b", "main")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "inflection 0.5.1 from its sdist")
    commits = []
    mod = work / "inflection" / "__init__.py"
    for singular, plural in PLURALS[:instances]:
        text = mod.read_text()
        mod.write_text(text.replace("_irregular('zombie', 'zombies')\n",
                                    f"_irregular('zombie', 'zombies')\n_irregular('{singular}', '{plural}')\n"))  # fmt: skip
        git(work, "commit", "-qam", f"irregular plural: {singular} -> {plural}")
        commits.append(git(work, "rev-parse", "HEAD"))
    mirrors = root / "mirrors"
    mirrors.mkdir()
    git(root, "clone", "-q", "--bare", str(work), str(mirrors / "pypi__inflection.git"))
    return mirrors, commits


async def build_all(root: Path, name: str, tasks: list[Task], mirrors: Path) -> tuple[float, float, list[EnvRecord]]:
    """(wall seconds, cache MB, records) of building ``tasks``' environments at once, fresh caches."""
    cfg = FarmConfig.model_validate({"tasks": {"path": str(root / "none.jsonl"), "mirror_dir": str(mirrors),
                                               "cache_dir": str(root / f"tc-{name}")},
                                     "envs": {"cache_dir": str(root / f"envs-{name}")},
                                     "sandbox": {"local": {"base_dir": str(root / f"sb-{name}")}}})  # fmt: skip
    runtime = TaskRuntime.from_config(cfg.tasks)
    envs = EnvProvider(cfg.envs, runtime, lambda spec: create_sandbox(cfg.sandbox, spec))
    runtime.envs = envs
    t0 = time.monotonic()
    recs = await asyncio.gather(*(envs.ensure(t) for t in tasks))
    wall = time.monotonic() - t0
    bad = [r for r in recs if not r.ok]
    if bad:
        sys.exit(f"bench_envs: {name}: {bad[0].reason}\n{bad[0].log_tail()}")
    return wall, disk_usage(str(envs.store.root)) / MB, recs


def layered_figures(root: Path, console: Console, deps: list[str], instances: int) -> dict[str, float]:
    mirrors, commits = eight_commits(root / "repo", instances)
    base = layer_base(deps)
    meta = {"version": "0.5", "environment_setup_commit": commits[-1]}
    layered = [Task(id=f"pypi__inflection-{i}", instruction="x", workspace=GitSource(repo="pypi/inflection", base_commit=c),
                    base_setup_commands=base, setup_commands=LAYER_SETUP, metadata=meta, verify_commands=["true"])
               for i, c in enumerate(commits)]  # fmt: skip
    old_way = layered[0].model_copy(update={"base_setup_commands": [], "setup_commands": base + LAYER_SETUP})
    one_s, one_mb, _ = asyncio.run(build_all(root, "one", [old_way], mirrors))
    console.print(f"one instance, one snapshot: {one_s:.1f} s, {one_mb:.0f} MB")
    layered_s, layered_mb, recs = asyncio.run(build_all(root, "layered", layered, mirrors))
    assert len({r.base_key for r in recs}) == 1 and [r.base_commit for r in recs] == commits
    console.print(f"{instances} instances on one base: {layered_s:.1f} s, {layered_mb:.0f} MB "
                  f"(instance layers: {', '.join(f'{r.size_bytes / MB:.2f}' for r in recs)} MB)")  # fmt: skip
    return {"instances": instances, "layered_disk_mb": layered_mb, "one_instance_disk_mb": one_mb,
            "layered_build_s": layered_s, "one_instance_build_s": one_s}  # fmt: skip


def line(figures: dict[str, float]) -> str:
    return "bench_envs: " + " ".join(
        f"{k}={v}" if isinstance(v, int) else f"{k}={v:.3f}" if v < 10 else f"{k}={v:.1f}" for k, v in figures.items()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=8, help="rollouts in the group")
    ap.add_argument("--harness", default="claude_code")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--layers-only", action="store_true", help="only the layered environments part (no farm run)")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs (1 rollout a run, 2 instances, no "
                         "packages but pytest): its figures mean nothing")
    args = ap.parse_args()
    deps, instances = DEPS, INSTANCES
    if args.quick:
        # one rollout a run: a group sharing one snapshot is tests/farm/test_farm_e2e.py's (n=2)
        args.n, deps, instances = 1, [], 2
    root = Path(tempfile.mkdtemp(prefix="bench-envs-"))
    console = Console(stderr=True)
    try:
        if args.layers_only:
            print(line(layered_figures(root, console, deps, instances)))
            return
        pip_tasks = make_task_set(root / "task-pip", installer="pip", extra_deps=deps)
        uv_tasks = make_task_set(root / "task-uv", installer="uv", extra_deps=deps)
        ray.init(num_cpus=2, include_dashboard=False, namespace="farm", log_to_driver=False)

        walls, results = {}, {}
        cfg_setup = config(root, pip_tasks, "setup", args.n, args.harness)
        t0 = time.monotonic()
        with DiskSampler(root / "sb-setup") as setup_disk:
            summary = run_batch(cfg_setup, console=Console(quiet=True))
        walls["setup"] = time.monotonic() - t0
        results["setup"] = rows(root / "out-setup")
        console.print(f"setup per sandbox: {summary.by_status} in {walls['setup']:.1f} s")

        cfg_snap = config(root, pip_tasks, "snapshot", args.n, args.harness)
        build_s, snapshot_bytes, layers = asyncio.run(build_once(cfg_snap, pip_tasks))
        console.print(f"snapshot built (pip) in {build_s:.1f} s, {snapshot_bytes / MB:.0f} MB")
        t0 = time.monotonic()
        with DiskSampler(root / "sb-snapshot") as snap_disk:
            summary = run_batch(cfg_snap, console=Console(quiet=True))
        walls["snapshot"] = time.monotonic() - t0
        results["snapshot"] = rows(root / "out-snapshot")
        console.print(f"from the snapshot: {summary.by_status} in {walls['snapshot']:.1f} s")

        uv_cfg = cfg_snap.model_copy(deep=True)
        uv_cfg.envs.cache_dir = str(root / "envs-uv")
        uv_build_s, _, _ = asyncio.run(build_once(uv_cfg, uv_tasks))
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
        views = view_times(layers, root)
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
            **layered_figures(root, console, deps, instances),
        }
        print(f"bench_envs (n={args.n}, {args.harness}, deps: {' '.join(['pytest', *deps])}):", file=sys.stderr)
        print(line(figures))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if not args.keep:
            for mounted in (root,):
                unmount_under(mounted)
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
