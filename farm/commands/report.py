"""``farm report RUN_DIR [-o report.html]``: one self-contained HTML report of an output
directory (summary, plots, rollout table, each rollout's trajectory). Reads files only:
works on a finished run and on one in progress (what the manifests list so far)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="a farm run's output.dir")
    parser.add_argument("-o", "--output", default=None, help="the HTML file (default: OUTPUT_DIR/report.html)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: engine.tokenizer of the run)")


def run(args: argparse.Namespace) -> int:
    # the CLI's start-up: a command loads its code when it runs; heavy: numpy, pyarrow, pydantic
    from farm.errors import FarmError
    from farm.report.html import write_report

    out = Path(args.output_dir)
    if not out.is_dir():
        print(f"farm report: {out} is not a directory", file=sys.stderr)
        return 2
    try:
        dest = write_report(out, args.output, tokenizer=args.tokenizer)
    except (FarmError, FileNotFoundError) as exc:
        print(f"farm report: {exc}", file=sys.stderr)
        return 1
    print(f"farm report: wrote {dest} ({dest.stat().st_size:,} bytes)")
    return 0
