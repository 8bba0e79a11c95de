"""``farm fill-mirror MIRROR SOURCE... [--commit SHA]...``: write the blobs a mirror lacks from
a release's files (a PyPI sdist or wheel, or a directory).

For a mirror made without its large files, whose rows fail with ``IncompleteTree``. Only a
file whose bytes hash to a missing blob's id is written (git's own check), so any archive is
safe to offer. Prints each blob filled and what is still missing; exit 0 when nothing the
commits (default: every ref's history) need is missing any more, 1 when something is, 2 on
an error. Then ``farm envs rm --failed`` lets environments that failed on the mirror build again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("mirror", help="the bare mirror (<owner>__<repo>.git) or a repository's .git")
    parser.add_argument("sources", nargs="+", metavar="SOURCE",
                        help="an sdist (.tar.gz), a wheel or .zip, or a directory, e.g. from "
                             "`pip download --no-deps --no-binary :all: NAME==VERSION`")  # fmt: skip
    parser.add_argument("--commit", action="append", default=[], metavar="SHA",
                        help="look only at these commits' trees (and name the missing paths); "
                             "default: every ref's history")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    # the CLI's start-up: a command loads its code when it runs
    from farm.errors import FarmError
    from farm.tasks.mirror_fill import fill_mirror

    try:
        report = fill_mirror(Path(args.mirror), [Path(s) for s in args.sources], args.commit)
    except FarmError as exc:
        print(f"farm fill-mirror: {exc}", file=sys.stderr)
        return 2
    for oid, member in report.filled.items():
        print(f"filled {oid[:12]} from {member}")
    for oid, paths in report.still_missing.items():
        print(f"still missing {oid[:12]}" + (f" ({', '.join(paths)})" if paths else ""))
    where = f"the trees of {len(args.commit)} commit(s)" if args.commit else "every ref's history"
    print(f"farm fill-mirror: {len(report.filled)} of {report.missing_before} missing object(s) of {where} "
          f"filled from {len(args.sources)} source(s); {len(report.still_missing)} still missing",
          file=sys.stderr)  # fmt: skip
    return 1 if report.still_missing else 0
