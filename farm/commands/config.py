"""``farm config show|schema|reference``: the run config, as farm resolves and documents it.

- ``show [--config F] [--set k=v ...] [--for run|rollout|serve]``: the effective config as
  YAML (the file, then the overrides, then the command's defaults and every model
  default), credentials masked; the environment variables it
  reads secrets from are named with whether they are set, never their values.
- ``schema [-o FILE]``: the JSON Schema of a config file (for editors: completion, hover
  docs, validation; see docs/reference/config.md).
- ``reference [-o FILE] [--schema FILE]``: the configuration reference (Markdown),
  generated from the pydantic models; ``--schema`` also writes the schema file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from farm import config_reference as ref
from farm.config import load_config, load_single_config
from farm.errors import ConfigError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="config_command", required=True)
    show = sub.add_parser("show", help="the effective config (YAML), credentials masked")
    show.add_argument("--config", default=None, help="YAML config (default: farm's defaults)")
    show.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    show.add_argument("--for", dest="for_command", choices=("run", "rollout", "serve"), default="run",
                      help="the command whose config it is (rollout / serve: output.dir is the `rollouts` "
                      "directory beside the config's, run_id rollouts, unless --set names them)")
    schema = sub.add_parser("schema", help="the JSON Schema of a config file (for editors)")
    schema.add_argument("-o", "--output", default=None, help="write it here (default: stdout)")
    ref = sub.add_parser("reference", help="the configuration reference (Markdown), from the models")
    ref.add_argument("-o", "--output", default=None, help="write it here (default: stdout)")
    ref.add_argument("--schema", default=None, metavar="FILE", help="also write the JSON Schema here")


def _emit(text: str, dest: str | None) -> None:
    if dest is None:
        sys.stdout.write(text)
        return
    path = Path(dest)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    print(f"farm config: wrote {path}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    if args.config_command == "show":
        try:
            load = load_config if args.for_command == "run" else load_single_config
            cfg = load(args.config, args.overrides)
        except ConfigError as exc:
            print(f"farm config show: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(ref.effective_yaml(cfg, os.environ))
        return 0
    if args.config_command == "schema":
        _emit(ref.schema_text(), args.output)
        return 0
    _emit(ref.render_markdown(), args.output)
    if args.schema:
        _emit(ref.schema_text(), args.schema)
    return 0
