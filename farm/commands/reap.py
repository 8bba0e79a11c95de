"""``farm reap --run-id X [--backend local|e2b]``: kill every sandbox labelled with a run id.

Use it after a crashed run (local sandboxes normally die with farm; E2B sandboxes live
until their timeout). The E2B API key is read here, from ``E2B_API_KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-id", required=True, help="the run id the sandboxes are labelled with")
    parser.add_argument("--backend", choices=["local", "e2b"], default=None, help="default: the config's, else local")
    parser.add_argument("--config", default=None, help="YAML config (for sandbox.local.base_dir / sandbox.e2b)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")


def run(args: argparse.Namespace) -> int:
    # heavy: numpy, pyarrow, pydantic; the CLI's start-up: a command loads its code when it runs
    from farm.config import load_config
    from farm.errors import FarmError

    try:
        cfg = load_config(args.config, args.overrides).sandbox
        backend = args.backend or cfg.backend
        if backend == "local":
            # heavy: only the chosen sandbox backend (local or e2b)
            from farm.sandboxes.local import reap

            reaped = asyncio.run(reap(args.run_id, cfg=cfg.local))
        else:
            # heavy: only the chosen sandbox backend (local or e2b)
            from farm.sandboxes.e2b import reap as reap_e2b

            api_key = os.environ.get("E2B_API_KEY")
            if not api_key:
                print("farm reap: E2B_API_KEY is not set", file=sys.stderr)
                return 2
            reaped = asyncio.run(reap_e2b(args.run_id, api_key=api_key, cfg=cfg.e2b))
    except FarmError as exc:
        print(f"farm reap: {exc}", file=sys.stderr)
        return 1
    for sandbox_id in reaped:
        print(sandbox_id)
    print(f"farm reap: {len(reaped)} {backend} sandbox(es) of run {args.run_id!r} killed", file=sys.stderr)
    return 0
