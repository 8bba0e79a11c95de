"""``farm rollout --task ID [--tasks FILE] --harness NAME [--endpoint NAME] [--json]``:
one rollout, its events streamed to the terminal, its result printed.

The same farm as ``farm run`` (``farm.Rollouts``: sandboxes, harness, gateway, grading,
Samples), for one task: progress lines go to stderr (one per phase and per turn), the
result to stdout (JSON with ``--json``: status, reward, turns, tokens, duration, output
paths). The rollout is finalized: its Samples and rollouts row are written to
``output.dir``. Exit 0 for a policy outcome (completed, timeout, ...: graded or
trainable), 1 for an infrastructure failure, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--task", required=True, help="task id (in --tasks, else the config's tasks.path)")
    parser.add_argument("--tasks", default=None, metavar="FILE", help="task file (sets tasks.path)")
    parser.add_argument("--harness", default=None, help="claude_code, codex or opencode (default: the config's)")
    parser.add_argument("--endpoint", default=None, metavar="NAME", help="a named model endpoint of the config")
    parser.add_argument("--config", default=None, help="YAML config (default: farm's defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--placement", choices=("auto", "local", "ray"), default="auto",
                        help="where rollouts run: this process, or the farm's sandbox actors on Ray "
                        "(auto: Ray when RAY_ADDRESS or ray.address is set)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


def overrides_of(args: argparse.Namespace) -> list[str]:
    """--tasks and --endpoint are config overrides, as ``--set`` takes them (applied last)."""
    extra = list(args.overrides)
    if args.tasks:
        extra.append(f"tasks.path={args.tasks}")
    if args.endpoint:
        extra.append(f"endpoint={args.endpoint}")
    return extra


def progress_line(ev: dict[str, Any]) -> str | None:
    kind = ev["kind"]
    if kind == "phase":
        return f"[{ev['phase']}]"
    if kind == "turn_finished":
        tools = ", ".join(ev["tool_calls"]) or "-"
        return (f"turn {ev['turn']}: prompt {ev['prompt_tokens']} tok, output {ev['output_tokens']} tok, "
                f"{ev['finish_reason']}, tools: {tools}")  # fmt: skip
    if kind == "result":
        return f"{ev['status']} reward={ev['reward']:g} turns={ev['turns']} in {ev['duration_s']:.1f} s"
    return None


async def _one(args: argparse.Namespace, overrides: list[str]) -> dict[str, Any]:
    # heavy: numpy, pyarrow, pydantic, aiohttp, orjson; the CLI's start-up: a command loads its code when it runs
    from farm.config import load_single_config
    from farm.errors import TaskError
    from farm.run.tasks import load_run_tasks
    from farm.secrets import RunSecrets
    from farm.single import Rollouts

    cfg = load_single_config(args.config, overrides)
    tasks = load_run_tasks(cfg)
    if args.task not in {t.id for t in tasks}:  # before anything starts
        raise TaskError(f"unknown task {args.task!r} in {cfg.tasks.path}")
    async with Rollouts(cfg, tasks=tasks, secrets=RunSecrets.from_environ(cfg, os.environ),
                         placement=args.placement) as farm_:
        handle = await farm_.start(args.task, harness=args.harness)
        async for ev in handle.events():
            line = progress_line(ev)
            if line is not None:
                print(f"{handle.id} {line}", file=sys.stderr, flush=True)
        return await handle.finalize()


def run(args: argparse.Namespace) -> int:
    # the CLI's start-up: a command loads its code when it runs; heavy: pydantic
    from farm.errors import FarmError
    from farm.status import RolloutStatus

    try:
        result = asyncio.run(_one(args, overrides_of(args)))
    except FarmError as exc:
        print(f"farm rollout: {exc}", file=sys.stderr)
        return 2 if type(exc).__name__ in ("ConfigError", "TaskError") else 1
    except KeyboardInterrupt:
        print("farm rollout: interrupted (the rollout was aborted; nothing stored)", file=sys.stderr)
        return 130
    out = {k: result[k] for k in ("id", "task_id", "harness", "status", "reason", "reward", "turns", "tokens",
                                  "duration_s", "stored", "outputs")}  # fmt: skip
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"{out['id']}: {out['status']} reward={out['reward']:g} turns={out['turns']} "
              f"tokens={out['tokens']['prompt']}+{out['tokens']['output']} {out['duration_s']:.1f} s"
              + (f" ({out['reason']})" if out["reason"] else ""))  # fmt: skip
        for name, path in out["outputs"].items():
            print(f"  {name}: {path}")
    return 0 if RolloutStatus(out["status"]).trainable else 1
