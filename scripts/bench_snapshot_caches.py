#!/usr/bin/env python
"""A snapshot's venvs with and without the build's bytecode and pytest caches, side by side.

An environment's build writes what every later sandbox on it would compile: its venvs'
bytecode (uv, the recipes' installer, writes none) and pytest's rewrites of their plugins
(``farm.tasks.pycache.snapshot_warm_script``, ``tasks.warm_pytest_caches``). No sandbox keeps
what it writes, so without them every graded test run compiles them all again.

The row: a recipe book row built from a PyPI sdist (``tests/testkit/sdist_task.py``;
``--project``: REQUESTS, requests 2.31.0 as psf/requests, by default; DJANGO, SCIKIT_LEARN...),
set up by the book's own recipe with real packages. For ``cold`` (``tasks.warm_pytest_caches:
false``) and ``warm`` (true), each with an environment cache of its own: the environment
built (``*_build_s``), then ``--n`` gradings of the row's gold patch, one after the other,
each in a fresh sandbox on the snapshot; a grading's CPU is its sandbox's cgroup count
(the test command, grading's own steps, the jail), its ``test_s`` the test command's wall time.

Last line: ``bench_snapshot_caches: cold_grade_cpu_s=… warm_grade_cpu_s=… saved_cpu_s=…
cold_test_s=… warm_test_s=… cold_build_s=… warm_build_s=… cold_snapshot_mb=… warm_snapshot_mb=…
resolved=…`` (medians; ``*_snapshot_mb``: the environment's layers on disk; ``resolved``: the
gradings that resolved, of both modes). ``--quick``: one grading a mode (the suite's
size: a check that it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the sdist projects live with the tests that build rows from them

from farm.config import load_config  # noqa: E402
from farm.envs.provider import provider_for  # noqa: E402
from farm.grading.grader import grade, grading_spec  # noqa: E402
from farm.run.tasks import load_task_file  # noqa: E402
from farm.sandboxes.factory import create_sandbox  # noqa: E402
from farm.tasks.runtime import TaskRuntime  # noqa: E402
from testkit import sdist_task  # noqa: E402


async def one_mode(made: dict, work: Path, *, warm: bool, n: int) -> dict:
    cfg = load_config(None, [
        f"tasks.path={made['tasks']}", f"tasks.mirror_dir={made['mirrors']}", f"tasks.warm_pytest_caches={warm}",
        f"tasks.cache_dir={work / 'tasks'}", f"envs.cache_dir={work / 'envs'}", f"sandbox.local.base_dir={work / 'sb'}",
    ])  # fmt: skip
    loaded = load_task_file(cfg)
    if len(loaded.tasks) != 1:
        raise SystemExit(f"bench_snapshot_caches: the row did not load: {'; '.join(map(str, loaded.errors))}")
    (task,) = loaded.tasks
    runtime = await asyncio.to_thread(TaskRuntime.from_config, cfg.tasks)
    sandboxes = []

    async def new_sandbox(spec):  # noqa: ANN001, ANN202
        sandboxes.append(await create_sandbox(cfg.sandbox, spec))
        return sandboxes[-1]

    runtime.envs = provider_for(cfg.envs, cfg.sandbox, runtime, new_sandbox)
    labels = {"run_id": f"bench-caches-{'warm' if warm else 'cold'}"}
    try:
        t0 = time.monotonic()
        await runtime.sandbox_spec(task, grading_spec(task, labels))  # the build
        build_s = time.monotonic() - t0
        ident = await runtime.envs.identity(task)
        layers = [runtime.envs.store.record(k) for k in {ident.key, *([ident.base.key] if ident.base else [])}]
        size_mb = sum(r.size_bytes for r in layers if r is not None) / 2**20
        sandboxes.clear()
        cpu, test, resolved = [], [], 0
        for _ in range(n):
            async def fresh():  # noqa: ANN202
                return await new_sandbox(await runtime.sandbox_spec(task, grading_spec(task, labels)))

            report = await grade(task, task.gold_patch or "", runtime=runtime, make_sandbox=fresh)
            # (a grading whose tests could not be reached tries the empty patch in a second sandbox)
            cpu.append(sum(sb.cpu.total_s() or 0.0 for sb in sandboxes))
            sandboxes.clear()
            test.append(report.timings.get("test_s", 0.0))
            resolved += bool(report.resolved)
            print(f"  {'warm' if warm else 'cold'}: resolved={report.resolved} cpu_s={cpu[-1]:.3f} "
                  f"test_s={test[-1]:.3f}", flush=True)  # fmt: skip
    finally:
        await runtime.envs.close()
    return {"build_s": build_s, "snapshot_mb": size_mb, "cpu_s": statistics.median(cpu), "test_s": statistics.median(test),
            "resolved": resolved}  # fmt: skip


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", default="REQUESTS", help="a project of tests/testkit/sdist_task.py with a book recipe")
    ap.add_argument("--n", type=int, default=5, help="gradings a mode")
    ap.add_argument("--quick", action="store_true", help="one grading a mode (the suite's size)")
    args = ap.parse_args()
    n = 1 if args.quick else args.n
    root = Path(tempfile.mkdtemp(prefix="bench-caches-"))
    try:
        made = await asyncio.to_thread(sdist_task.make_book_task, root / "row", getattr(sdist_task, args.project))
        out = {}
        for name, warm in (("cold", False), ("warm", True)):
            out[name] = await one_mode(made, root / name, warm=warm, n=n)
            print(f"bench_snapshot_caches[{name}]: " + " ".join(f"{k}={round(v, 3)}" for k, v in out[name].items()),
                  flush=True)  # fmt: skip
    finally:
        shutil.rmtree(root, ignore_errors=True)
    c, w = out["cold"], out["warm"]
    print(f"bench_snapshot_caches: cold_grade_cpu_s={c['cpu_s']:.3f} warm_grade_cpu_s={w['cpu_s']:.3f} "
          f"saved_cpu_s={c['cpu_s'] - w['cpu_s']:.3f} cold_test_s={c['test_s']:.3f} warm_test_s={w['test_s']:.3f} "
          f"cold_build_s={c['build_s']:.1f} warm_build_s={w['build_s']:.1f} cold_snapshot_mb={c['snapshot_mb']:.1f} "
          f"warm_snapshot_mb={w['snapshot_mb']:.1f} resolved={c['resolved'] + w['resolved']}")


if __name__ == "__main__":
    asyncio.run(main())
