"""Rows of the recipe book's repositories too large to mirror here, built from PyPI sdists.

    python scripts/sdist_rows.py OUT [NAME...]      # NAME: DJANGO, DJANGO_30, DJANGO_32, SCIKIT_LEARN

Each project of ``tests/testkit/sdist_task.py`` (its release, a small bug on top, the test that
catches it) becomes one SWE-bench row in ``OUT/rows.jsonl``, its instance id
``<owner>__<repo>-sdist-<version>``, and its repository a bare mirror in ``OUT/mirrors`` (projects of
one repository share it). Then ``scripts/validate_book.py OUT/rows.jsonl OUT/mirrors --sdist`` validates
them with the book's own recipes, counted apart from published rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the projects live with the tests that build rows from them

from testkit import sdist_task  # noqa: E402

NAMES = ("DJANGO", "DJANGO_30", "DJANGO_32", "SCIKIT_LEARN")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="directory for rows.jsonl and mirrors/")
    p.add_argument("names", nargs="*", choices=NAMES, default=list(NAMES), metavar="NAME", help=", ".join(NAMES))
    args = p.parse_args(argv)
    out = Path(args.out)
    (out / "mirrors").mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.names:
        project = getattr(sdist_task, name)
        made = sdist_task.make_book_task(out / "work" / name, project)
        rows.append({**made["row"], "instance_id": f"{project.repo.replace('/', '__')}-sdist-{project.row_version}"})
        built = made["mirrors"] / (project.repo.replace("/", "__") + ".git")
        mirror = out / "mirrors" / built.name
        if mirror.exists():  # another release of the same repository: its commits go in too
            subprocess.run(["git", "--git-dir", str(mirror), "fetch", "-q", str(built),
                            f"+refs/heads/main:refs/heads/{name.lower()}"], check=True)  # fmt: skip
        else:
            shutil.copytree(built, mirror)
        print(f"{rows[-1]['instance_id']}: {project.package} {project.version}, base {rows[-1]['base_commit'][:12]}")
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"sdist_rows: {len(rows)} row(s) in {out / 'rows.jsonl'}, mirrors in {out / 'mirrors'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
