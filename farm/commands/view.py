"""``farm view RUN_DIR [--port N]``: the ``farm report`` page served on 127.0.0.1,
rendered again whenever the run's manifests or summary change."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="a farm run's output.dir")
    parser.add_argument("--port", type=int, default=8866, help="port on 127.0.0.1 (default 8866)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: engine.tokenizer of the run)")


def run(args: argparse.Namespace) -> int:
    # heavy: aiohttp
    from aiohttp import web

    # heavy: aiohttp, numpy, pyarrow
    from farm.report.server import make_app

    out = Path(args.output_dir)
    if not out.is_dir():
        print(f"farm view: {out} is not a directory", file=sys.stderr)
        return 2
    print(f"farm view: http://127.0.0.1:{args.port}/ (Ctrl-C stops)")
    web.run_app(make_app(out, args.tokenizer), host="127.0.0.1", port=args.port, print=None)
    return 0
