#!/usr/bin/env python
"""Container images as environments, against a real registry on 127.0.0.1 (docker-registry).

Eight instance images in SWE-bench's layout (``tests/testkit/dataset_images.py``: a Debian base
layer and conda's layout shared, ``/testbed`` per instance, each holding one of farm's demo
repositories) are pushed to a fresh registry, then, in one process:

- ``pull_s``: one image's blobs fetched into an empty store (resolve + download, checked);
  ``image_mb``: its layers uncompressed;
- ``unpack_mb_s``: the image's layers unpacked into an empty store as a rollout's first sandbox
  puts them there (``farm.envs.image.ensure_layers``: every layer at once, each checked against
  its diff_id and published): its uncompressed MB per wall second, beside ``gnu_tar_mb_s``, GNU
  tar extracting the same blobs (``tar -xzf``, one per layer, all at once: no whiteouts, no
  checks: the floor a tar can be unpacked at here); and per CPU-second of each
  (``unpack_cpu_mb_s``, ``gnu_tar_cpu_mb_s``: what the code costs, on a node other work
  shares); the median of 3 paired rounds (1 with ``--quick``);
- ``first_create_s``: a rollout's sandbox from nothing: pull, unpack, the activation captured,
  the instance environment built, the sandbox created (the relinked CLI included);
- ``create_p50_ms``: a sandbox for the image with a warm pool (``sandbox.pool``, 2 per
  environment, refilled between acquires) beside ``cold_create_p50_ms`` (no pool);
- ``disk_ratio``: the store holding all 8 images' environments / holding one (layers shared);
- ``rollouts`` / ``resolved``: the 8 rows' rollouts through ``farm.Rollouts`` in this process
  (the actors and pipeline of ``farm run``; Claude Code, the scripted oracle engine behind the
  real router, local sandboxes from the images).

``--tree DIR``: instead, a directory of your choosing (a tree the unpack was not tuned on: a
Python install, a node_modules) packed by GNU tar as one gzip layer (``tar -czf``, outside the
timing), then unpacked by ``farm.images.unpack.unpack_layer`` (what ``ensure_layers`` runs per
layer) beside ``tar -xzf``, paired rounds, the median; last line ``bench_images_tree: tree_mb=…
files=… unpack_mb_s=… gnu_tar_mb_s=… unpack_cpu_mb_s=… gnu_tar_cpu_mb_s=…`` (the tree named on the
line before).
Each timed unpack starts after ``sync``: the last one's writeback is not the next one's cost.

Last line: ``bench_images: image_mb=… pull_s=… unpack_mb_s=… first_create_s=… create_p50_ms=…
instances=8 disk_ratio=… rollouts=… resolved=…`` (side figures before it). Targets on this
machine: unpack_mb_s >= 100, create_p50_ms <= 50, disk_ratio <= 1.5, every rollout resolved.
``--quick``: one unpack round, 3 creates each way and rollouts on 2 of the 8 rows.
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT / "tests"))  # the image builders the tests use (tests/testkit: not part of farm)

from farm.envs.config import EnvsConfig  # noqa: E402
from farm.envs.image import ensure_layers  # noqa: E402
from farm.envs.provider import EnvProvider  # noqa: E402
from farm.envs.store import EnvStore  # noqa: E402
from farm.harnesses import make_harness  # noqa: E402
from farm.harnesses.config import HarnessConfig  # noqa: E402
from farm.images.auth import Credentials  # noqa: E402
from farm.images.config import ImagesConfig  # noqa: E402
from farm.images.pull import ImagePuller  # noqa: E402
from farm.images.unpack import unpack_layer  # noqa: E402
from farm.sandboxes.base import SandboxSpec  # noqa: E402
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig, SandboxPoolConfig  # noqa: E402
from farm.sandboxes.factory import create_sandbox  # noqa: E402
from farm.sandboxes.pool import SandboxPool  # noqa: E402
from farm.sandboxes.watchdog import disk_usage  # noqa: E402
from farm.tasks.config import TasksConfig  # noqa: E402
from farm.tasks.loaders import load_tasks  # noqa: E402
from farm.tasks.runtime import TaskRuntime  # noqa: E402
from testkit.dataset_images import base_layers, demo_rows, mirror_of, push_image, swebench_row  # noqa: E402
from testkit.oci import OciLayout  # noqa: E402
from testkit.registry import LocalRegistry  # noqa: E402

INSTANCES = 8


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def publish(host: str, work: Path) -> list[dict]:
    """8 instance images (SWE-bench's layout) and the rows that name them."""
    base = base_layers()
    demos, mirrors = demo_rows(work / "demo")
    picked = [d for d in demos.values() if d.get("test_patch")][:INSTANCES]
    if len(picked) < INSTANCES:
        raise SystemExit(f"bench_images: the demo set has {len(picked)} SWE tasks with a test patch, not {INSTANCES}")
    layout = OciLayout(work / "layout")
    rows = []
    for demo in picked:
        name = f"{host}/swebench/sweb.eval.x86_64.{demo['id']}:latest"
        push_image(layout, base, mirror_of(mirrors, demo), demo["workspace"]["base_commit"], name)
        rows.append(swebench_row(demo, image=name))
    return rows


async def pull_and_unpack(name: str, work: Path, rounds: int) -> dict[str, float]:
    puller = ImagePuller(ImagesConfig(), Credentials(), work / "blobs")
    try:
        t0 = time.perf_counter()
        image = await puller.resolve(name)
        blobs = [await puller.fetch(image, layer) for layer in image.manifest.layers]
        pull_s = time.perf_counter() - t0
        kept = work / "kept"  # the product removes a blob once its layer is unpacked: each round links them back
        kept.mkdir()
        for blob in blobs:
            os.link(blob, kept / blob.name)
        ours, gnu = [], []
        for i in range(rounds):  # paired: the two side by side in each round, the median of each reported
            for blob in blobs:
                blob.unlink(missing_ok=True)
                os.link(kept / blob.name, blob)
            os.sync()
            ours.append(await _product_unpack(image, puller, work / f"store-{i}"))
            os.sync()
            gnu.append(_gnu_tar([kept / blob.name for blob in blobs], work / f"tar-{i}"))
        # the rounds' trees are removed after the last: on ext4 without a journal a file made
        # within a minute of deletions in its block group costs 20-30x the kernel CPU (see
        # farm.images.unpack.spread_inodes), so removing one round's tree would slow the next
        # (ours and tar's alike) by what the bench itself did, not by what is measured
        for i in range(rounds):
            shutil.rmtree(work / f"store-{i}", ignore_errors=True)
            shutil.rmtree(work / f"tar-{i}", ignore_errors=True)
    finally:
        await puller.close()
    mb = ours[0][0] / 1e6
    med = {k: statistics.median(r[j] for r in runs) for k, j, runs in
           (("ours_s", 1, ours), ("ours_cpu", 2, ours), ("tar_s", 0, gnu), ("tar_cpu", 1, gnu))}  # fmt: skip
    # CPU seconds besides wall: on a node shared with other work, MB per CPU-second says what the code costs
    return {"image_mb": mb, "pull_s": pull_s, "unpack_mb_s": mb / med["ours_s"], "gnu_tar_mb_s": mb / med["tar_s"],
            "unpack_cpu_mb_s": mb / med["ours_cpu"], "gnu_tar_cpu_mb_s": mb / med["tar_cpu"]}  # fmt: skip


async def _product_unpack(image, puller: ImagePuller, store_dir: Path) -> tuple[int, float, float]:  # noqa: ANN001
    """The image's layers into an empty store as ``farm.envs.image.build_image`` puts them there
    (all at once, each published): its uncompressed bytes, wall and CPU seconds."""
    store = EnvStore(store_dir)
    t0, c0 = time.perf_counter(), time.process_time()
    keys = await ensure_layers(image, store=store, puller=puller, lock_timeout_s=600)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    failed = [k for k in keys if isinstance(k, BaseException)]
    if failed:
        raise failed[0]
    tar_bytes = sum(store.record(k).image["tar_bytes"] for k in keys)  # type: ignore[union-attr,misc]
    return tar_bytes, wall, cpu


def _gnu_tar(blobs: list[Path], dest: Path) -> tuple[float, float]:
    """GNU tar extracting the same blobs, one tar per layer, all at once: wall and CPU seconds."""
    dirs = [dest / str(i) for i in range(len(blobs))]
    for d in dirs:
        d.mkdir(parents=True)
    t0, c0 = time.perf_counter(), _children_cpu()
    procs = [subprocess.Popen(["tar", "-xzf", str(blob), "-C", str(d), "--no-same-owner", "--exclude=dev/*"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for blob, d in zip(blobs, dirs)]  # fmt: skip
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"bench_images: GNU tar failed: {proc.stderr.read().decode(errors='replace')}")  # type: ignore[union-attr]
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    return wall, cpu


def tree_unpack(tree: Path, work: Path, rounds: int) -> dict[str, float]:
    """``tree`` packed as one gzip layer by GNU tar, then unpacked by farm and by GNU tar, paired
    rounds (their trees removed after the last, as in ``pull_and_unpack``)."""
    blob = work / "tree.tar.gz"
    subprocess.run(["tar", "-czf", str(blob), "-C", str(tree.parent), tree.name], check=True)
    ours, gnu = [], []
    try:
        for i in range(rounds):
            os.sync()
            dest = work / f"ours-{i}"
            dest.mkdir()
            t0, c0 = time.perf_counter(), time.process_time()
            with blob.open("rb") as fh:
                report = unpack_layer(fh, "gzip", dest, what=str(tree))
            ours.append((time.perf_counter() - t0, time.process_time() - c0))
            os.sync()
            gnu.append(_gnu_tar([blob], work / f"tar-{i}"))
    finally:
        for i in range(rounds):
            shutil.rmtree(work / f"ours-{i}", ignore_errors=True)
            shutil.rmtree(work / f"tar-{i}", ignore_errors=True)
    mb = report.tar_bytes / 1e6
    med = [statistics.median(r[j] for r in runs) for runs in (ours, gnu) for j in (0, 1)]
    return {"tree_mb": mb, "files": report.files, "unpack_mb_s": mb / med[0], "unpack_cpu_mb_s": mb / med[1],
            "gnu_tar_mb_s": mb / med[2], "gnu_tar_cpu_mb_s": mb / med[3]}  # fmt: skip


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def environments(rows: list[dict], work: Path, creates: int) -> dict[str, float]:
    tasks_file = work / "rows.jsonl"
    tasks_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = load_tasks(TasksConfig(path=str(tasks_file))).tasks
    runtime = TaskRuntime.from_config(TasksConfig(path=str(tasks_file), cache_dir=str(work / "tc")))
    sb_cfg = SandboxConfig(local=LocalSandboxConfig(base_dir=str(work / "sb")))
    store = work / "envs"

    async def make(spec: SandboxSpec):
        return await create_sandbox(sb_cfg, spec)

    provider = EnvProvider(EnvsConfig(cache_dir=str(store)), runtime, make, labels={"run_id": "bench-images"})
    runtime.envs = provider
    cli = str(await make_harness(HarnessConfig(name="claude_code")).install())
    out: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        view = await provider.view_for(tasks[0])
        spec = SandboxSpec(view=view, host_programs=[cli], labels={"run_id": "bench-images"})
        sb = await make(spec)
        out["first_create_s"] = time.perf_counter() - t0
        await sb.close()
        one = disk_usage(str(store))
        await asyncio.gather(*(provider.view_for(t) for t in tasks[1:]))
        out["disk_ratio"] = disk_usage(str(store)) / one
        out["store_mb"] = disk_usage(str(store)) / 1e6
        cold = []
        for _ in range(creates):
            t0 = time.perf_counter()
            sb = await make(spec)
            cold.append((time.perf_counter() - t0) * 1000)
            await sb.close()
        pool = SandboxPool(make, SandboxPoolConfig(size=2))
        warm = []
        await (await pool.acquire(spec)).close()  # the first acquire starts the environment's refills
        for _ in range(creates):
            deadline = time.monotonic() + 120
            while pool.idle < 2 and time.monotonic() < deadline:  # a rollout's worth of time to refill
                await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            sb = await pool.acquire(spec)
            warm.append((time.perf_counter() - t0) * 1000)
            await sb.close()
        await pool.close()
        out["cold_create_p50_ms"], out["create_p50_ms"] = p50(cold), p50(warm)
    finally:
        await provider.close()
    return out


async def rollouts(rows: list[dict], work: Path, n: int) -> dict[str, int]:
    """The rows' rollouts through farm.Rollouts in this process (the same actors and pipeline as
    `farm run`, no Ray: its start needs a quiet node), Claude Code, the scripted oracle engine."""
    import farm

    tasks_file = work / "rollout_rows.jsonl"
    tasks_file.write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
    overrides = [f"tasks.path={tasks_file}", f"envs.cache_dir={work / 'envs'}", f"sandbox.local.base_dir={work / 'sb'}",
                 f"output.dir={work / 'out'}", "run_id=bench-images", f"tasks.cache_dir={work / 'tc'}",
                 f"rollout.concurrency={min(n, 4)}"]  # fmt: skip
    async with farm.Rollouts(ROOT / "configs/local.yaml", overrides=overrides, placement="local") as service:
        handles = [await service.start(r["instance_id"], harness="claude_code") for r in rows[:n]]
        results = [await h.finalize() for h in handles]
    return {"rollouts": len(results), "resolved": sum(1 for r in results if r.get("reward") == 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="one unpack round, 3 creates each way, rollouts on 2 of the 8 rows")
    ap.add_argument("--work", default=None, help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--tree", type=Path, default=None, help="unpack this directory (packed by tar -czf) beside GNU tar")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-images-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.tree is not None:
        try:
            f = tree_unpack(args.tree.resolve(), work, 1 if args.quick else 3)
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
        print(f"bench_images_tree (the tree): {args.tree.resolve()}")
        print(f"bench_images_tree: tree_mb={f['tree_mb']:.1f} files={f['files']} "
              f"unpack_mb_s={f['unpack_mb_s']:.1f} gnu_tar_mb_s={f['gnu_tar_mb_s']:.1f} "
              f"unpack_cpu_mb_s={f['unpack_cpu_mb_s']:.1f} gnu_tar_cpu_mb_s={f['gnu_tar_cpu_mb_s']:.1f}")  # fmt: skip
        return
    try:
        with LocalRegistry(work / "registry") as registry:
            t0 = time.perf_counter()
            rows = publish(registry.host, work)
            print(f"bench_images: 8 images built and pushed in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            figures = asyncio.run(pull_and_unpack(rows[0]["image_name"], work / "pull", 1 if args.quick else 3))
            figures |= asyncio.run(environments(rows, work, 3 if args.quick else 10))
            figures |= asyncio.run(rollouts(rows, work, 2 if args.quick else INSTANCES))
    finally:
        if args.work is None:
            subprocess.run(["umount", "-R", "-l", str(work / "sb")], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)
    side = ("gnu_tar_mb_s", "unpack_cpu_mb_s", "gnu_tar_cpu_mb_s", "cold_create_p50_ms", "store_mb")
    print("bench_images (side by side): " + " ".join(f"{k}={figures[k]:.2f}" for k in side))
    print(f"bench_images: image_mb={figures['image_mb']:.1f} pull_s={figures['pull_s']:.2f} "
          f"unpack_mb_s={figures['unpack_mb_s']:.1f} first_create_s={figures['first_create_s']:.2f} "
          f"create_p50_ms={figures['create_p50_ms']:.1f} instances={INSTANCES} disk_ratio={figures['disk_ratio']:.2f} "
          f"rollouts={figures['rollouts']} resolved={figures['resolved']}")  # fmt: skip


if __name__ == "__main__":
    main()
