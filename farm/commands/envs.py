"""``farm envs build|ls|rm|gc``: the environment snapshot cache (``envs.cache_dir``).

- ``build TASKS``: build every distinct environment of a task file once (concurrently,
  ``--concurrency`` at a time); prints one line per environment (key, tasks, built /
  cached / FAILED, build time, size). Exit 1 if any failed.
- ``ls``: key, tasks, size, build time, last use, in use.
- ``rm KEY... | --failed | --all``: remove snapshots (a snapshot a live sandbox uses stays
  unless ``--force``).
- ``gc --max-size 20G``: least-recently-used snapshots go until the cache fits.
"""

from __future__ import annotations

import argparse
import sys
import time


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="envs_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=None, help="farm YAML config (envs.*, sandbox.*, tasks.*)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    b = sub.add_parser("build", parents=[common], help="build each distinct environment of a task file once")
    b.add_argument("tasks", help="task file or 'demo'")
    b.add_argument("--concurrency", type=int, default=2, help="environments built at once")
    b.add_argument("--only", action="append", default=[], metavar="TASK_ID", help="only these tasks' environments")
    sub.add_parser("ls", parents=[common], help="list snapshots")
    r = sub.add_parser("rm", parents=[common], help="remove snapshots")
    r.add_argument("keys", nargs="*", help="keys (or unique prefixes)")
    r.add_argument("--failed", action="store_true", help="every failed build (so the next use builds again)")
    r.add_argument("--all", action="store_true", help="every snapshot")
    r.add_argument("--force", action="store_true", help="also snapshots a live sandbox uses")
    g = sub.add_parser("gc", parents=[common], help="remove least-recently-used snapshots until the cache fits")
    g.add_argument("--max-size", required=True, help="e.g. 50G, 500M, or bytes")


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _ago(ts: float) -> str:
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


async def _build(cfg, tasks, concurrency: int) -> int:  # noqa: ANN001 - FarmConfig, [Task]
    import asyncio

    import os

    from farm.envs.provider import provider_for
    from farm.sandboxes.factory import create_sandbox, make_limiter
    from farm.tasks.runtime import TaskRuntime

    runtime = await asyncio.to_thread(TaskRuntime.from_config, cfg.tasks)
    limiter = make_limiter(cfg.sandbox)

    api_key = os.environ.get("E2B_API_KEY") if cfg.sandbox.backend == "e2b" else None

    def new_sandbox(spec):  # noqa: ANN001, ANN202
        return create_sandbox(cfg.sandbox, spec, limiter=limiter, e2b_api_key=api_key)

    envs = provider_for(cfg.envs.model_copy(update={"enabled": True}), cfg.sandbox, runtime, new_sandbox,
                        e2b_api_key=api_key)  # fmt: skip
    if envs is None:
        print("farm envs build: this sandbox backend cannot start from snapshots (local needs isolation: bwrap; "
              "E2B needs envs.e2b_templates)", file=sys.stderr)  # fmt: skip
        return 2
    runtime.envs = envs
    by_key: dict[str, list] = {}
    for task in tasks:
        try:
            ident = await envs.identity(task)
        except Exception as exc:  # noqa: BLE001 - a task whose source is missing: say so, go on
            print(f"{task.id}: cannot identify its environment: {exc}")
            continue
        by_key.setdefault(ident.key, []).append(task)
    sem = asyncio.Semaphore(max(1, concurrency))
    failed = 0

    async def one(key: str, group: list) -> None:
        nonlocal failed
        async with sem:
            cached = envs.store.record(key) is not None
            try:
                rec = await envs.ensure(group[0])
            except Exception as exc:  # noqa: BLE001 - infrastructure: reported, the others go on
                failed += 1
                print(f"{key[:12]}  {len(group):>3} task(s)  ERROR  {type(exc).__name__}: {exc}")
                return
        state = "cached" if cached else "built" if rec.ok else "FAILED"
        failed += 0 if rec.ok else 1
        detail = f"{rec.build_s:6.1f} s  {human(rec.size_bytes):>9}" if rec.ok else rec.reason[:200]
        print(f"{key[:12]}  {len(group):>3} task(s)  {state:<6}  {detail}  ({group[0].id})", flush=True)

    await asyncio.gather(*(one(k, g) for k, g in by_key.items()))
    print(f"envs build: {len(by_key)} environment(s) for {len(tasks)} task(s), {failed} failed, in {envs.store.root}")
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    import asyncio

    from farm.config import load_config
    from farm.envs.store import EnvStore
    from farm.errors import ConfigError, TaskLoadError

    overrides = list(args.overrides)
    if args.envs_command == "build":
        overrides.append(f"tasks.path={args.tasks}")
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"farm envs: {exc}", file=sys.stderr)
        return 2
    store = EnvStore(cfg.envs.cache_dir)
    if args.envs_command == "build":
        from farm.tasks.loaders import load_tasks

        try:
            loaded = load_tasks(cfg.tasks)
        except TaskLoadError as exc:
            print(f"farm envs build: {exc}", file=sys.stderr)
            return 2
        for err in loaded.errors:
            print(f"skipped: {err}", file=sys.stderr)
        tasks = [t for t in loaded.tasks if not args.only or t.id in args.only]
        if not tasks:
            print("farm envs build: no tasks", file=sys.stderr)
            return 1
        return asyncio.run(_build(cfg, tasks, args.concurrency))
    if args.envs_command == "ls":
        entries = store.entries()
        print(f"{'KEY':<12}  {'STATE':<6}  {'SIZE':>9}  {'BUILD':>7}  {'LAST USE':>10}  TASK")
        for e in sorted(entries, key=lambda e: -e.last_used):
            r = e.record
            state = ("in use" if e.in_use else "ok") if r.ok else "FAILED"
            print(f"{r.key[:12]}  {state:<6}  {human(e.size_bytes):>9}  {r.build_s:6.1f}s  {_ago(e.last_used):>10}  "
                  f"{', '.join(r.task_ids)}" + ("" if r.ok else f"  {r.reason[:120]}"))  # fmt: skip
        print(f"envs: {len(entries)} snapshot(s), {human(sum(e.size_bytes for e in entries))} in {store.root}")
        return 0
    if args.envs_command == "rm":
        entries = store.entries()
        if args.all:
            keys = [e.record.key for e in entries]
        elif args.failed:
            keys = [e.record.key for e in entries if not e.record.ok]
        else:
            keys = []
            for prefix in args.keys:
                match = [e.record.key for e in entries if e.record.key.startswith(prefix)]
                if len(match) != 1:
                    print(f"farm envs rm: {prefix!r} matches {len(match)} snapshots", file=sys.stderr)
                    return 2
                keys += match
        kept = [k for k in keys if not store.remove(k, force=args.force)]
        print(f"envs rm: removed {len(keys) - len(kept)}" + (f", kept {len(kept)} in use" if kept else ""))
        return 1 if kept else 0
    removed = store.gc(parse_size(args.max_size))
    print(f"envs gc: removed {len(removed)} snapshot(s); {human(sum(e.size_bytes for e in store.entries()))} left")
    return 0
