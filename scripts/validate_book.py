"""Validate farm's recipe book on real SWE-bench rows: every row, its reason, its part.

    python scripts/validate_book.py ROWS MIRRORS [--split SPLIT] [--part all|fix|heldout]
        [--out DIR] [--concurrency N] [--rerun invalid|all] [--seen ID ...] [--config C] [--set KEY=VALUE ...]
        [--publish]

ROWS: SWE-bench rows as published (``.jsonl``, FAIL_TO_PASS / PASS_TO_PASS as JSON strings), no
setup or recipe of their own; MIRRORS: bare mirrors named ``<owner>__<repo>.git``. The rows go
through ``farm validate-tasks``' own code (loading with the book's recipes, environments built
once per repository-version, the gold and the empty patch graded in fresh sandboxes): nothing is
graded twice or otherwise. SPLIT is a JSON file whose ``heldout`` list names the rows held out
while the book was fixed (``fix`` is every other row); ``--part`` validates one part only. Its
optional ``rounds`` (``{"NAME": [ids]}``) names held-out rows found later and run after the fixes
made before them: the page gives each round's figure apart.

Resumable: each row's result is appended to ``DIR/results.jsonl`` as it comes, and a rerun skips
the rows already there (``--rerun invalid`` tries again those that were not valid, after a fix).
A held-out row re-run after a change made once its failure was seen (``--seen ID``) keeps its
first outcome beside the new one: the held-out figure counts the first (a change tuned on a row
is no result on it), the page shows both.
A row whose mirror is missing, or lacks objects of the tree it needs, is counted apart
(``incomplete_mirror``); a row that does not load (its recipe needs what this machine lacks) is
``skipped``. The environments' build times come from the environment store's records.
``--publish`` writes the committed results and the docs page made of them
(``farm.tasks.book_report``). The last line:

    validate_book: rows=… valid=… invalid=… skipped=… incomplete_mirror=… heldout_valid=…/… seconds=…

(``heldout_valid``: valid of the held-out rows whose tree is complete, by first runs; ``seconds``: wall time of
every invocation on this output directory, summed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from farm.tasks.book_report import (  # noqa: E402
    PAGE_PATH, RESULTS_PATH, BookResults, RowResult, env_times, first_run, render_markdown, summary_line,
)  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rows", help="SWE-bench rows (.jsonl), as published")
    p.add_argument("mirrors", help="directory of bare mirrors <owner>__<repo>.git")
    p.add_argument("--split", default=None, help="JSON file: a 'heldout' list of instance ids, a 'method' in words, optional 'rounds'")
    p.add_argument("--part", choices=("all", "fix", "heldout"), default="all")
    p.add_argument("--out", default="validate-book", help="results directory (resumable)")
    p.add_argument("--concurrency", type=int, default=2, help="rows validated at once (2 sandboxes each)")
    p.add_argument("--rerun", choices=("none", "invalid", "all"), default="none",
                   help="validate again the rows already recorded as not valid (or all of them)")
    p.add_argument("--only", action="append", default=[], metavar="ID", help="these rows only")
    p.add_argument("--seen", action="append", default=[], metavar="ID",
                   help="validate again this held-out row, after a change made once its failure was seen: "
                        "its first outcome stays what the held-out figure counts")
    p.add_argument("--repo", action="append", default=[], metavar="OWNER/NAME", help="these repositories' rows only")
    p.add_argument("--config", default=None, help="farm YAML config (sandbox, envs, tasks.* settings)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--sdist", action="store_true",
                   help="the rows are built from PyPI sdists (tests/testkit/sdist_task.py), counted apart from published ones")
    p.add_argument("--report-only", action="store_true", help="validate nothing: summarize the results recorded")
    p.add_argument("--publish", action="store_true", help=f"write {RESULTS_PATH} and {PAGE_PATH}")
    p.add_argument("--measured", default="", help="--publish: when and where it was measured, in words")
    p.add_argument("--rows-source", default="", help="--publish: where the rows came from, in words")
    return p.parse_args(argv)


def mirror_of(mirrors: Path, repo: str) -> Path:
    return mirrors / (repo.replace("/", "__") + ".git")


def incomplete(reason: str) -> bool:
    """Did the row fail on its mirror (objects of a tree it needs are missing)?"""
    return reason.startswith("IncompleteTree") or " is incomplete in " in reason


def read_results(path: Path) -> dict[str, RowResult]:
    out: dict[str, RowResult] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = RowResult.model_validate_json(line)
                out[r.id] = r  # the last line of a row wins (a rerun)
    return out


def short_reason(validation) -> str:  # noqa: ANN001 - farm.grading.validate.TaskValidation
    """The reason, with the tests that decided it when the gold patch did not resolve."""
    reason = validation.reason
    gold = validation.gold
    if gold is not None and not gold.resolved:
        bad = [f"{t} {s}" for t, s in {**gold.fail_to_pass, **gold.pass_to_pass}.items() if s not in ("PASSED", "XFAIL")]
        if bad:
            more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
            reason += f" [failing: {'; '.join(bad[:3])}{more}]"
    return reason


class Recorder:
    """Appends each row's result to results.jsonl as it comes (a stopped run loses none)."""

    def __init__(self, path: Path, rows: dict[str, dict], heldout: set[str], sdist: bool = False,
                 seen: Iterable[str] = ()) -> None:  # fmt: skip
        self.path, self.rows, self.heldout, self.sdist = path, rows, heldout, sdist
        self.results = read_results(path)
        # a held-out row re-run after its failure was seen keeps its first outcome (the held-out figure's)
        self.first = {i: first_run(self.results[i]) for i in seen if i in self.results and i in heldout}

    def add(self, row_id: str, outcome: str, reason: str, seconds: float = 0.0, left_out: list[str] | None = None) -> None:
        row, before = self.rows[row_id], self.results.get(row_id)
        first = self.first.get(row_id) or (before.first_outcome if before is not None else None)  # kept by a rerun
        result = RowResult(id=row_id, repo=row["repo"], version=str(row.get("version", "")),
                           part="sdist" if self.sdist else "heldout" if row_id in self.heldout else "fix",
                           outcome=outcome, reason=reason,
                           seconds=round(seconds, 1), left_out=left_out or [],
                           first_outcome=first)  # fmt: skip
        self.results[row_id] = result
        with self.path.open("a") as f:
            f.write(result.model_dump_json() + "\n")

    def on_validation(self, validation) -> None:  # noqa: ANN001 - TaskValidation
        detail = self.path.parent / "validations"  # the whole validation (test output ends, steps) per row
        detail.mkdir(exist_ok=True)
        (detail / f"{validation.task_id}.json").write_text(validation.model_dump_json(indent=1))
        gold = validation.gold
        left_out = list(gold.setup.left_out) if gold is not None and gold.setup is not None else []
        outcome = "valid" if validation.valid else "incomplete_mirror" if incomplete(validation.reason) else "invalid"
        self.add(validation.task_id, outcome, short_reason(validation), validation.duration_s, left_out)


def build_times(cfg, rows: dict[str, dict]):  # noqa: ANN001, ANN201 - FarmConfig, [EnvTime]
    """Per repository-version, from the environment store: the latest build of each kind per row."""
    from farm.envs.store import EnvStore

    latest: dict[tuple[str, str], tuple[float, float]] = {}
    for entry in EnvStore(Path(cfg.envs.cache_dir).expanduser()).entries():
        rec = entry.record
        if not rec.ok or not rec.task_ids or rec.task_ids[0] not in rows:
            continue
        key = (rec.task_ids[0], rec.kind)
        if key not in latest or rec.built_at > latest[key][0]:
            latest[key] = (rec.built_at, rec.build_s)
    return env_times((rows[t]["repo"], str(rows[t].get("version", "")), kind, s) for (t, kind), (_, s) in latest.items())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.monotonic()
    from rich.console import Console

    from farm.commands.validate_tasks import _validate
    from farm.config import load_config
    from farm.run.tasks import load_task_file

    console = Console(stderr=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mirrors = Path(args.mirrors).resolve()
    lines = [ln for ln in Path(args.rows).read_text().splitlines() if ln.strip()]
    all_rows = {json.loads(ln)["instance_id"]: json.loads(ln) for ln in lines}
    split = json.loads(Path(args.split).read_text()) if args.split else {"heldout": [], "method": "none"}
    heldout = set(split["heldout"])
    chosen = [i for i in all_rows if (args.part == "all" or (i in heldout) == (args.part == "heldout"))
              and (not args.only or i in args.only) and (not args.repo or all_rows[i]["repo"] in args.repo)]  # fmt: skip
    rec = Recorder(out / "results.jsonl", all_rows, heldout, sdist=args.sdist, seen=args.seen)
    for i in args.seen:  # nothing to keep: say so rather than record a first outcome that is not one
        if i not in heldout or i not in rec.results:
            console.print(f"[yellow]--seen {i}: {'not a held-out row' if i not in heldout else 'no earlier result'}: "
                          "this run's outcome is its first[/yellow]")  # fmt: skip
    rerun = {"none": set(), "all": set(chosen),
             "invalid": {i for i, r in rec.results.items() if r.outcome != "valid"}}[args.rerun] | set(args.seen)  # fmt: skip
    todo = [] if args.report_only else [i for i in chosen if i not in rec.results or i in rerun]
    for i in list(todo):
        if not mirror_of(mirrors, all_rows[i]["repo"]).exists():
            rec.add(i, "incomplete_mirror", f"no mirror {mirror_of(mirrors, all_rows[i]['repo']).name} in {mirrors}")
            todo.remove(i)
    if todo:
        rows_file = out / "rows.todo.jsonl"  # what is left to do, in the rows' own words
        rows_file.write_text("".join(json.dumps(all_rows[i]) + "\n" for i in todo))
        cfg = load_config(args.config, [f"tasks.mirror_dir={mirrors}", *args.overrides, f"tasks.path={rows_file}"])
        loaded = load_task_file(cfg)
        skipped: dict[str, list[str]] = {}
        for err in loaded.errors:  # a row's every problem, in one reason
            if 1 <= getattr(err, "line", 0) <= len(todo):
                skipped.setdefault(todo[err.line - 1], []).append(str(err).split(": ", 1)[-1])
            console.print(f"[yellow]skipped: {err}[/yellow]")
        for row_id, reasons in skipped.items():
            rec.add(row_id, "skipped", "; ".join(reasons))
        tasks = list(loaded.tasks)
        console.print(f"validate_book: {len(tasks)} row(s) to validate, {len(chosen) - len(todo)} done before")
        if tasks:
            asyncio.run(_validate(cfg, tasks, args.concurrency, console, on_result=rec.on_validation))
    else:
        cfg = load_config(args.config, [f"tasks.mirror_dir={mirrors}", *args.overrides])
    state_path = out / "state.json"
    state = json.loads(state_path.read_text()) if state_path.is_file() else {"seconds": 0.0}
    state["seconds"] += 0.0 if args.report_only else time.monotonic() - t0
    state_path.write_text(json.dumps(state))
    round_of = {i: name for name, ids in split.get("rounds", {}).items() for i in ids}  # a held-out row's round
    results = [rec.results[i].model_copy(update={"heldout_round": round_of.get(i, "") if i in heldout else ""})
               for i in chosen if i in rec.results]  # fmt: skip
    seconds = round(state["seconds"], 1)  # the line is made of what is published (x.5 rounds to even)
    line = summary_line(results, seconds)
    book = BookResults(measured=args.measured, rows_file=args.rows_source or str(args.rows),
                       split=f"{len(heldout & set(chosen))} rows; {split.get('method', 'listed in ' + str(args.split))}",
                       seconds=seconds, summary=line, rows=results,
                       envs=build_times(cfg, {i: all_rows[i] for i in chosen}))  # fmt: skip
    (out / "report.json").write_text(book.model_dump_json(indent=1))
    if args.publish:
        (ROOT / RESULTS_PATH).write_text(book.model_dump_json(indent=1) + "\n")
        (ROOT / PAGE_PATH).write_text(render_markdown(book))
        console.print(f"validate_book: wrote {RESULTS_PATH} and {PAGE_PATH}")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
