"""The ``farm`` command line (also ``python -m farm``).

Each subcommand lives in its own module under ``farm.commands`` with
``configure(parser)`` and ``run(args) -> int``; this file only dispatches, and imports
a command's module (and so its heavy dependencies) only when that command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("farm.commands.run", "run rollouts for a config"),
    "rollout": ("farm.commands.rollout", "run one rollout, streaming its events (farm.Rollouts)"),
    "serve": ("farm.commands.serve", "serve farm.Rollouts over HTTP (REST + SSE) on 127.0.0.1"),
    "validate-tasks": ("farm.commands.validate_tasks", "check every task: gold resolves, empty does not"),
    "fill-mirror": ("farm.commands.fill_mirror", "write a mirror's missing blobs from a release's files (an sdist)"),
    "envs": ("farm.commands.envs", "environment snapshots: build, ls, show, rm, gc"),
    "inspect": ("farm.commands.inspect", "summarize an output directory; a rollout's task and a Sample decoded"),
    "report": ("farm.commands.report", "write a self-contained HTML report of an output directory"),
    "view": ("farm.commands.view", "serve the HTML report on 127.0.0.1, refreshed as the run goes on"),
    "verify": ("farm.commands.verify", "check an output directory's shards and tables (--repair fixes them)"),
    "export": ("farm.commands.export", "copy a run's committed tables as Parquet (current schema version)"),
    "config": ("farm.commands.config", "the effective config (show), its JSON Schema, its reference"),
    "dashboard": ("farm.commands.dashboard", "farm's Grafana dashboard for the Ray dashboard; the metrics it shows"),
    "reap": ("farm.commands.reap", "kill every sandbox labelled with a run id"),
    "engine": ("farm.commands.engine", "run the scripted SGLang-protocol worker"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="farm", description="Ray rollout farm for agentic RL on SWE tasks")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        try:
            importlib.import_module(module).configure(sp)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            sp.set_defaults(_missing=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = getattr(args, "_missing", None)
    if missing:
        print(f"farm {args.command}: not wired yet ({missing} does not exist)", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
