"""``farm verify RUN_DIR [--repair]``: check every shard of an output directory against
its manifest, and the Samples against the rollouts table.

Prints one line per problem and a last summary line; exit 0 when there is none, 1
otherwise. ``--repair`` (only while no run holds the directory) runs the recovery a
resume runs, plus a manifest rebuilt from the shards when it is corrupt: unlisted
complete shards are adopted, damaged ones quarantined (``quarantine/``, never deleted),
rows rebuilt from committed Samples, rollouts whose Samples are lost retracted so the
next ``farm run`` runs them again; then it checks again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="the output directory (output.dir of the run)")
    parser.add_argument("--repair", action="store_true", help="adopt / quarantine / rebuild, then check again")


def _check(out: Path) -> int:
    # heavy: numpy, pyarrow, pydantic
    from farm.output.verify import verify_dir

    res = verify_dir(out)
    for p in res.problems:
        print(p)
    print(f"verify: {res.shards} shards checked ({res.rows_line()}), {len(res.problems)} problem(s) in {out}")
    return 1 if res.problems else 0


def _repair(out: Path) -> None:
    # heavy: numpy, pyarrow, pydantic; the CLI's start-up: a command loads its code when it runs
    from farm.output.config import OutputConfig
    from farm.output.reader import OutputReader
    from farm.output.writer import OutputWriter
    from farm.run.lock import RunLock

    raw = OutputReader(out).run_config()
    output = OutputConfig.model_validate({**(raw.get("output") or {}), "dir": str(out)})
    with RunLock(out, str(raw.get("run_id") or out.name)):
        store = OutputWriter(out, output, rebuild=True)
        try:
            store.recover()
            store.reconcile()
            for line in store.recovery_lines() or ["repair: nothing to do"]:
                print(line)
        finally:
            store.close()


def run(args: argparse.Namespace) -> int:
    # the CLI's start-up: a command loads its code when it runs
    from farm.errors import FarmError

    out = Path(args.run_dir)
    if not out.is_dir():
        print(f"farm verify: {out} is not a directory", file=sys.stderr)
        return 1
    if args.repair:
        try:
            _repair(out)
        except FarmError as exc:
            print(f"farm verify: {exc}", file=sys.stderr)
            return 1
    return _check(out)
