"""``farm envs build|ls|show|rm|gc``: the environment snapshot cache (``envs.cache_dir``).

- ``build TASKS``: build every distinct environment of a task file once (concurrently,
  ``--concurrency`` at a time): each base first (one per repository-version and recipe),
  then the environments (a whole one, or an instance layer on its base); prints one line
  per base and per environment (key, kind, tasks, built / cached / FAILED, build time,
  size). Exit 1 if any failed.
- ``ls``: key, kind (env / base / instance), state, size, build time, last use, tasks;
  an instance names its base, a base counts its instances; a failed build's reason, cut
  at a word with an ellipsis (``--full``: whole, on the lines below).
- ``show KEY``: one snapshot's whole record: identity, the reason whole, every setup
  command with its exit code and output tails.
- ``rm KEY... | --failed | --all``: remove snapshots (a snapshot a live sandbox uses, or a
  base with instances on it, stays unless ``--force``, which takes the instances too).
- ``gc --max-size 20G``: least-recently-used snapshots go until the cache fits (a base
  only once no instance is built on it).
"""

from __future__ import annotations

import argparse
import sys
import time
import os
import json


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="envs_command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=None, help="farm YAML config (envs.*, sandbox.*, tasks.*)")
    common.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    b = sub.add_parser("build", parents=[common], help="build each distinct environment of a task file once")
    b.add_argument("tasks", help="task file or 'demo'")
    b.add_argument("--concurrency", type=int, default=2, help="environments built at once")
    b.add_argument("--only", action="append", default=[], metavar="TASK_ID", help="only these tasks' environments")
    ls = sub.add_parser("ls", parents=[common], help="list snapshots")
    ls.add_argument("--full", action="store_true", help="failure reasons whole (else cut at a word, with an ellipsis)")
    show = sub.add_parser("show", parents=[common], help="one snapshot's whole record (reason, setup steps)")
    show.add_argument("key", help="a key (or a unique prefix)")
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


REASON_CHARS = 120  # of a failure reason on `ls`'s line


def shorten(text: str, width: int) -> str:
    """``text`` on one line within ``width`` characters, cut at a word boundary (a word
    longer than half the width is cut inside) and ending with an ellipsis when cut."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    cut = flat[: width - 1]
    space = cut.rfind(" ")
    if space >= width // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + "\u2026"


def _resolve(store, prefix: str) -> tuple[str | None, str]:  # noqa: ANN001 - EnvStore
    """The one key ``prefix`` names, or (None, why not)."""
    match = [e.record.key for e in store.entries() if e.record.key.startswith(prefix)]
    return (match[0], "") if len(match) == 1 else (None, f"{prefix!r} matches {len(match)} snapshots")


def show_record(store, key: str) -> str:  # noqa: ANN001 - EnvStore
    """Everything the store knows about one snapshot, reasons and output tails whole."""
    entry = next(e for e in store.entries() if e.record.key == key)
    r = entry.record
    state = ("in use" if entry.in_use else "ok") if r.ok else "FAILED"
    lines = [f"key:        {r.key}", f"kind:       {r.kind}", f"state:      {state}",
             f"tasks:      {', '.join(r.task_ids)}", f"size:       {human(entry.size_bytes)}",
             f"build:      {r.build_s:.1f} s, {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r.built_at))}",
             f"last use:   {_ago(entry.last_used)}", f"backend:    {r.backend}" + (f" (template {r.template})" if r.template else ""),
             f"mount:      {r.mount}"]  # fmt: skip
    if r.base_key:
        lines.append(f"base:       {r.base_key}")
    if r.kind == "base":
        lines.append(f"instances:  {', '.join(store.dependents(r.key)) or 'none'}")
    if r.base_commit:
        lines.append(f"commit:     {r.base_commit}")
    lines.append(f"identity:   {json.dumps(r.identity, sort_keys=True)}")
    if not r.ok:
        lines += ["reason:", *(f"  {ln}" for ln in r.reason.splitlines() or [""])]
    if r.setup.steps:
        lines.append(f"setup:      {len(r.setup.steps)} command(s), {r.setup.duration_s:.1f} s")
    for i, step in enumerate(r.setup.steps, 1):
        end = "timed out" if step.timed_out else f"exit {step.exit_code}"
        lines.append(f"  [{i}] {end} in {step.duration_s:.1f} s: {step.command}")
        for name, tail in (("stdout", step.stdout_tail), ("stderr", step.stderr_tail)):
            if tail.strip():
                lines += [f"      {name}:", *(f"        {ln}" for ln in tail.rstrip().splitlines())]
    return "\n".join(lines)


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


    # heavy: aiohttp, pydantic, numpy, pyarrow
    from farm.envs.provider import provider_for
    from farm.sandboxes.factory import create_sandbox, make_limiter
    from farm.secrets import REGISTRY_AUTH_ENV
    from farm.tasks.runtime import TaskRuntime

    runtime = await asyncio.to_thread(TaskRuntime.from_config, cfg.tasks)
    limiter = make_limiter(cfg.sandbox)

    api_key = os.environ.get("E2B_API_KEY") if cfg.sandbox.backend == "e2b" else None

    def new_sandbox(spec):  # noqa: ANN001, ANN202
        return create_sandbox(cfg.sandbox, spec, limiter=limiter, e2b_api_key=api_key)

    envs = provider_for(cfg.envs.model_copy(update={"enabled": True}), cfg.sandbox, runtime, new_sandbox,
                        e2b_api_key=api_key, registry_auth=os.environ.get(REGISTRY_AUTH_ENV))  # fmt: skip
    if envs is None:
        print("farm envs build: this sandbox backend cannot start from snapshots (local needs isolation: bwrap; "
              "E2B needs envs.e2b_templates)", file=sys.stderr)  # fmt: skip
        return 2
    runtime.envs = envs
    by_key: dict[str, list] = {}
    bases: dict[str, list] = {}
    kinds: dict[str, str] = {}
    for task in tasks:
        try:
            ident = await envs.identity(task)
        except Exception as exc:  # noqa: BLE001 - a task whose source is missing: say so, go on
            print(f"{task.id}: cannot identify its environment: {exc}")
            continue
        by_key.setdefault(ident.key, []).append(task)
        kinds[ident.key] = "env" if ident.base is None else "instance"
        if ident.base is not None:
            bases.setdefault(ident.base.key, []).append(task)
    sem = asyncio.Semaphore(max(1, concurrency))
    failed = 0

    async def one(key: str, group: list, kind: str) -> None:
        nonlocal failed
        async with sem:
            cached = envs.store.record(key) is not None
            try:
                rec = await (envs.ensure_base(group[0]) if kind == "base" else envs.ensure(group[0]))
            except Exception as exc:  # noqa: BLE001 - infrastructure: reported, the others go on
                failed += 1
                print(f"{key[:12]}  {kind:<8}  {len(group):>3} task(s)  ERROR  {type(exc).__name__}: {exc}")
                return
        if rec.key != key:  # its base failed: reported on the base's line
            failed += 1
            print(f"{key[:12]}  {kind:<8}  {len(group):>3} task(s)  FAILED  its base {rec.key[:12]} failed  "
                  f"({group[0].id})", flush=True)  # fmt: skip
            return
        state = "cached" if cached else "built" if rec.ok else "FAILED"
        failed += 0 if rec.ok else 1
        detail = f"{rec.build_s:6.1f} s  {human(rec.size_bytes):>9}" if rec.ok else shorten(rec.reason, 200)
        on = f"  on base {rec.base_key[:12]}" if rec.base_key else ""
        print(f"{key[:12]}  {kind:<8}  {len(group):>3} task(s)  {state:<6}  {detail}  ({group[0].id}){on}", flush=True)

    try:
        await asyncio.gather(*(one(k, g, "base") for k, g in bases.items()))
        await asyncio.gather(*(one(k, g, kinds[k]) for k, g in by_key.items()))
    finally:
        await envs.close()  # its registry connections
    print(f"envs build: {len(by_key)} environment(s) on {len(bases)} base(s) for {len(tasks)} task(s), {failed} failed, "
          f"in {envs.store.root}")  # fmt: skip
    return 1 if failed else 0


def run(args: argparse.Namespace) -> int:
    # asyncio only when the command runs (the CLI's start-up)
    import asyncio

    # heavy: numpy, pyarrow, pydantic; the CLI's start-up: a command loads its code when it runs
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
        from farm.run.tasks import load_task_file  # with `farm run`'s row checks (log_parser)

        try:
            loaded = load_task_file(cfg)
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
        print(f"{'KEY':<12}  {'KIND':<8}  {'STATE':<6}  {'SIZE':>9}  {'BUILD':>7}  {'LAST USE':>10}  TASK")
        cut = False
        for e in sorted(entries, key=lambda e: -e.last_used):
            r = e.record
            state = ("in use" if e.in_use else "ok") if r.ok else "FAILED"
            layer = f"  on base {r.base_key[:12]}" if r.base_key else ""
            if r.kind == "base":
                layer = f"  base of {sum(x.record.base_key == r.key for x in entries)} instance(s)"
            why = "" if r.ok or args.full else f"  {shorten(r.reason, REASON_CHARS)}"
            cut |= why.endswith("\u2026")
            print(f"{r.key[:12]}  {r.kind:<8}  {state:<6}  {human(e.size_bytes):>9}  {r.build_s:6.1f}s  "
                  f"{_ago(e.last_used):>10}  {', '.join(r.task_ids)}{layer}{why}")  # fmt: skip
            if not r.ok and args.full:
                print("".join(f"    {ln}\n" for ln in r.reason.splitlines()), end="")
        print(f"envs: {len(entries)} snapshot(s), {human(sum(e.size_bytes for e in entries))} in {store.root}")
        if cut:
            print("(reasons cut at a word: `farm envs ls --full` or `farm envs show KEY` shows them whole)")
        return 0
    if args.envs_command == "show":
        key, why = _resolve(store, args.key)
        if key is None:
            print(f"farm envs show: {why}", file=sys.stderr)
            return 2
        print(show_record(store, key))
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
                key, why = _resolve(store, prefix)
                if key is None:
                    print(f"farm envs rm: {why}", file=sys.stderr)
                    return 2
                keys.append(key)
        kept = []
        order = {"instance": 0, "env": 1, "base": 2}  # a base goes after the instances on it
        by_key = {e.record.key: e.record for e in entries}
        for k in sorted(keys, key=lambda k: order[by_key[k].kind]):
            why = store.blocker(k)
            if store.record(k) is not None and not store.remove(k, force=args.force):
                kept.append(k)
                print(f"kept {k[:12]}: {why or 'could not be removed'} (--force to remove it anyway)", file=sys.stderr)
        print(f"envs rm: removed {len(keys) - len(kept)}" + (f", kept {len(kept)}" if kept else ""))
        return 1 if kept else 0
    removed = store.gc(parse_size(args.max_size))
    print(f"envs gc: removed {len(removed)} snapshot(s); {human(sum(e.size_bytes for e in store.entries()))} left")
    return 0
