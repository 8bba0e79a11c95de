"""``farm validate-tasks TASKS``: the gold patch must resolve and the empty patch must not.

Prints a table, writes a JSON report, exits 1 if any task is invalid (or a row could not
be loaded), 2 on usage/config errors. Sandboxes come from the config's ``sandbox``
section (local by default); ``E2B_API_KEY`` is read here, at the entry point.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("tasks", help="task file (.jsonl/.json/.parquet) or 'demo'")
    parser.add_argument("--config", default=None, help="farm YAML config (sandbox backend, tasks.* settings)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--format", default=None, help="row format (default: tasks.format, 'auto')")
    parser.add_argument("--strict", action="store_true", help="refuse the file if a row is malformed (every bad row named)")
    parser.add_argument("--report", default="validate-tasks-report.json", help="JSON report path")
    parser.add_argument("--concurrency", type=int, default=4, help="tasks validated at once (2 sandboxes each)")
    parser.add_argument("--only", action="append", default=[], metavar="TASK_ID", help="validate only these ids")


def run(args: argparse.Namespace) -> int:
    # asyncio only when the command runs (the CLI's start-up)
    import asyncio

    # heavy: rich
    from rich.console import Console

    # heavy: numpy, pyarrow, pydantic; the CLI's start-up: a command loads its code when it runs
    from farm.config import load_config
    from farm.errors import ConfigError, TaskLoadError
    from farm.run.tasks import load_task_file

    console = Console(stderr=True)
    overrides = [*args.overrides, f"tasks.path={args.tasks}"]
    if args.strict:
        overrides.append("tasks.strict=true")
    if args.format:
        overrides.append(f"tasks.format={args.format}")
    try:
        cfg = load_config(args.config, overrides)
        loaded = load_task_file(cfg)  # a row farm cannot grade (its log_parser) is reported here
    except (ConfigError, TaskLoadError) as exc:
        console.print(f"[red]validate-tasks: {exc}[/red]")
        return 2
    for err in loaded.errors:
        console.print(f"[yellow]skipped: {err}[/yellow]")
    tasks = [t for t in loaded.tasks if not args.only or t.id in args.only]
    if not tasks:
        console.print("[red]validate-tasks: no tasks to validate[/red]")
        return 1
    t0 = time.monotonic()
    results = asyncio.run(_validate(cfg, tasks, args.concurrency, console))
    elapsed = time.monotonic() - t0
    _print_table(results, console)
    invalid = [r for r in results if not r.valid]
    report = build_report(loaded, results, elapsed)
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report, indent=1))
    console.print(
        f"validate-tasks: {report['valid']}/{len(results)} valid, {len(loaded.errors)} rows skipped, "
        f"{elapsed:.1f} s; report: {args.report}"
    )
    return 1 if invalid or loaded.errors else 0


def build_report(loaded, results, elapsed: float) -> dict:  # noqa: ANN001 - TaskLoadResult, [TaskValidation]
    """The JSON report: every reason and load error whole (the console shows them cut)."""
    invalid = sum(not r.valid for r in results)
    return {
        "tasks_path": loaded.path,
        "total": len(results),
        "valid": len(results) - invalid,
        "invalid": invalid,
        "load_errors": [str(e) for e in loaded.errors],
        "seconds": round(elapsed, 3),
        "results": [r.model_dump(mode="json") for r in results],
    }


def short(text: str, limit: int) -> str:
    """``text`` for the console: cut at ``limit`` characters, saying so."""
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters in the report]"


async def _validate(cfg, tasks, concurrency: int, console, on_result=None):  # noqa: ANN001, ANN202 - config/rich types
    """Validate ``tasks`` as the command does (each result printed as it comes, and handed to
    ``on_result``: scripts/validate_book.py keeps it)."""
    # asyncio only when the command runs (the CLI's start-up)
    import asyncio

    # heavy: aiohttp, pydantic, numpy, pyarrow
    from farm.envs.provider import provider_for
    from farm.grading.validate import validate_tasks
    from farm.secrets import REGISTRY_AUTH_ENV
    from farm.sandboxes.factory import create_sandbox, make_limiter
    from farm.tasks.runtime import TaskRuntime

    runtime = await asyncio.to_thread(TaskRuntime.from_config, cfg.tasks)
    limiter = make_limiter(cfg.sandbox)
    api_key = os.environ.get("E2B_API_KEY") if cfg.sandbox.backend == "e2b" else None
    labels = {"run_id": f"validate-{uuid.uuid4().hex[:8]}"}

    def new_sandbox(spec):  # noqa: ANN001, ANN202
        return create_sandbox(cfg.sandbox, spec, limiter=limiter, e2b_api_key=api_key)

    runtime.envs = provider_for(cfg.envs, cfg.sandbox, runtime, new_sandbox, e2b_api_key=api_key,
                                registry_auth=os.environ.get(REGISTRY_AUTH_ENV))  # one build per env

    # heavy: rich
    from rich.markup import escape

    def progress(result) -> None:  # noqa: ANN001
        mark = "[green]valid[/green]" if result.valid else "[red]INVALID[/red]"
        if result.reason:  # why it is invalid, or what a valid task's gold patch was flagged for
            mark += f" {escape(short(result.reason, 160))}"
        console.print(f"  {result.task_id}: {mark} ({result.duration_s:.1f} s)")
        if on_result is not None:
            on_result(result)

    try:
        results = await validate_tasks(
            tasks, runtime=runtime, new_sandbox=new_sandbox, concurrency=concurrency, labels=labels, on_result=progress
        )
        if runtime.envs is not None:  # a build only a cancelled grading asked for: finished, not cut as the loop closes
            await runtime.envs.settle()
        return results
    finally:
        if runtime.envs is not None:
            await runtime.envs.close()  # its registry connections


def _cell(report) -> str:  # noqa: ANN001 - GradingReport | None
    if report is None:
        return "-"
    summary = report.summary()
    detail = " ".join(f"{k}={summary[k]}" for k in ("f2p", "p2p", "verify") if k in summary)
    return f"{report.status.value} r={report.reward:g} {detail}".strip()


def _print_table(results, console) -> None:  # noqa: ANN001
    from rich.markup import escape
    # heavy: rich
    from rich.table import Table

    table = Table(title="farm validate-tasks")
    for col in ("task", "kind", "valid", "gold patch", "empty patch", "s", "reason"):
        table.add_column(col, overflow="fold")
    for r in results:
        table.add_row(
            r.task_id,
            r.kind,
            "[green]yes[/green]" if r.valid else "[red]NO[/red]",
            _cell(r.gold),
            _cell(r.empty),
            f"{r.duration_s:.1f}",
            escape(short(r.reason, 300)),
        )
    console.print(table)
    sys.stderr.flush()
