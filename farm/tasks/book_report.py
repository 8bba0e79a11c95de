"""The recipe book measured on real SWE-bench rows: the results and the page made of them.

``scripts/validate_book.py`` validates published rows with ``farm validate-tasks``' own
code (no second grader) and keeps one ``RowResult`` per row; ``--publish`` writes the
summary it measured (``RESULTS_PATH``, committed) and the page generated from it
(``PAGE_PATH``), as the configuration reference is generated from the models. The figures
are measured on one machine and cannot be recomputed by a test; the test checks that the
page is what this module makes of the committed results, and that they add up.

A row ends as one of four outcomes: ``valid`` (the gold patch resolves, the empty patch
does not), ``invalid`` (with the reason), ``skipped`` (it did not load: its recipe needs
what the machine lacks, or the row is malformed), ``incomplete_mirror`` (its repository's
mirror is missing, or lacks objects of the tree the row needs: counted apart, since no
recipe can help it). Rows are split into a part the book was fixed on (``fix``) and a part
held out while fixing (``heldout``), reported separately. Held-out rows may come in rounds
(``heldout_round``): a round found later is run after every fix made before it, so its first
runs measure the book as it now is on rows no one had seen; the page gives each round's figure.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RESULTS_PATH = "docs/reference/recipe-book-rows.json"
PAGE_PATH = "docs/reference/recipe-book.md"
GENERATE = "python scripts/validate_book.py ROWS MIRRORS --split SPLIT --publish"
Outcome = Literal["valid", "invalid", "skipped", "incomplete_mirror"]
OUTCOMES: tuple[Outcome, ...] = ("valid", "invalid", "skipped", "incomplete_mirror")


class RowResult(BaseModel):
    """One row's validation, as ``scripts/validate_book.py`` keeps it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    repo: str
    version: str
    part: Literal["fix", "heldout", "sdist"] = Field(
        default="fix", description="the part fixed on, held out, or a row built from a PyPI sdist (counted apart)"
    )
    outcome: Outcome
    reason: str = ""
    seconds: float = 0.0
    left_out: list[str] = Field(default_factory=list, description="what the environment left out (conda-only, ...)")
    first_outcome: Outcome | None = Field(
        default=None, description="a held-out row validated again after a change made once its failure was seen: "
        "its first outcome, which the held-out figure counts (the change was tuned on it)")
    heldout_round: str = Field(
        default="", description="the held-out round the row came in (the split file's ``rounds``), if any")


def first_run(row: RowResult) -> Outcome:
    """The outcome a held-out row counts with: its first, if it was re-run after its failure was seen."""
    return row.first_outcome or row.outcome


class EnvTime(BaseModel):
    """How long a repository-version's environments took to build here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    repo: str
    version: str
    base_s: float | None = Field(default=None, description="the shared base (venv + the spec's packages)")
    instance_s: float | None = Field(default=None, description="median of its rows' instance layers")
    instances: int = 0


class BookResults(BaseModel):
    """The committed measurement: every row's result and the environments' build times."""

    model_config = ConfigDict(extra="forbid")

    measured: str = Field(description="when and where, in words (the machine, its load)")
    rows_file: str = Field(description="where the rows came from (the published splits, their copies)")
    split: str = Field(description="how the held-out part was chosen")
    seconds: float = Field(description="wall time of every validate_book invocation that made these results, summed")
    summary: str = Field(description="validate_book's last line for these results")
    rows: list[RowResult]
    envs: list[EnvTime] = Field(default_factory=list)


def counts(rows: Iterable[RowResult]) -> dict[str, int]:
    c = Counter(r.outcome for r in rows)
    return {k: c.get(k, 0) for k in OUTCOMES}


def heldout_figure(rows: Iterable[RowResult]) -> tuple[int, int]:
    """(valid, rows whose tree is complete) of the held-out part, by first runs: skipped rows count as
    not valid, and a row re-run after its failure was seen counts with its first outcome."""
    held = [r for r in rows if r.part == "heldout" and first_run(r) != "incomplete_mirror"]
    return sum(first_run(r) == "valid" for r in held), len(held)


def summary_line(rows: list[RowResult], seconds: float) -> str:
    """validate_book's last line (the published rows: those built from sdists are counted apart)."""
    rows = [r for r in rows if r.part != "sdist"]
    c = counts(rows)
    hv, hn = heldout_figure(rows)
    return (f"validate_book: rows={len(rows)} valid={c['valid']} invalid={c['invalid']} skipped={c['skipped']} "
            f"incomplete_mirror={c['incomplete_mirror']} heldout_valid={hv}/{hn} seconds={seconds:.0f}")  # fmt: skip


def _version_key(version: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in version.lstrip("v").split(".")]


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f}%" if d else "-"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _part_note(r: RowResult) -> str:
    if r.first_outcome is not None:
        return f" (held out; first run {r.first_outcome}, then re-run after a change made once its failure was seen)"
    return " (held out)" if r.part == "heldout" else ""


def render_markdown(results: BookResults) -> str:
    """The docs page: figures per part, then a table per repository and version."""
    rows = results.rows
    out = [
        "# The recipe book on real SWE-bench rows",
        "",
        "<!-- generated by scripts/validate_book.py --publish from recipe-book-rows.json: do not edit -->",
        "",
        f"Every published SWE-bench row farm could fetch the repository of, through `farm validate-tasks`' own "
        f"code with nothing but the rows and the mirrors (`scripts/validate_book.py`; how: "
        f"[SWE-bench rows](../how-to/swe-bench.md#the-whole-book-on-real-rows)). Measured {results.measured}.",
        "",
        f"Rows: {results.rows_file}",
        "",
        f"Held out: {results.split}",
        "",
        "```",
        results.summary,
        "```",
        "",
        "| part | rows | valid | invalid | skipped | incomplete mirror | valid of the complete trees |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    seen = [r for r in rows if r.first_outcome is not None]
    held = [r for r in rows if r.part == "heldout"]
    rounds = list(dict.fromkeys(r.heldout_round for r in held if r.heldout_round))
    parts = [("fixed on", [r for r in rows if r.part == "fix"], False),
             ("held out" + (" (first runs)" if seen else ""), held, True),
             *[(f"held out, round {name} (first runs)", [r for r in held if r.heldout_round == name], True)
               for name in rounds],
             *([("held out (re-runs after a failure was seen included)", held, False)] if seen else []),
             ("all published", [r for r in rows if r.part != "sdist"], False),
             ("from PyPI sdists", [r for r in rows if r.part == "sdist"], False)]  # fmt: skip
    for name, sel, first in parts:
        if not sel:
            continue
        c = Counter(first_run(r) for r in sel) if first else counts(sel)
        complete = len(sel) - c["incomplete_mirror"]
        out.append(f"| {name} | {len(sel)} | {c['valid']} | {c['invalid']} | {c['skipped']} | {c['incomplete_mirror']} "
                   f"| {c['valid']}/{complete} ({_pct(c['valid'], complete)}) |")  # fmt: skip
    envs = {(e.repo, e.version): e for e in results.envs}
    groups: dict[tuple[str, str], list[RowResult]] = defaultdict(list)
    for r in rows:
        groups[(r.repo, r.version)].append(r)
    out += [
        "",
        "Per repository and version (rows held out in brackets; build times in seconds on this machine: "
        "the shared base environment, and the median of the rows' instance layers; a version marked "
        "*sdist* is a row built from the release's PyPI sdist, for a repository too large to mirror here):",
        "",
        "| repository | version | rows | valid | base env s | instance s | the other rows |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for repo, version in sorted(groups, key=lambda k: (k[0], _version_key(k[1]))):
        sel = groups[(repo, version)]
        held = sum(r.part == "heldout" for r in sel)
        valid = sum(r.outcome == "valid" for r in sel)
        valid_held = sum(r.outcome == "valid" and r.part == "heldout" for r in sel)
        env = envs.get((repo, version))
        base = f"{env.base_s:.0f}" if env and env.base_s is not None else "-"
        inst = f"{env.instance_s:.0f}" if env and env.instance_s is not None else "-"
        others = "; ".join(f"{r.id}{_part_note(r)}: {r.outcome}" + (f": {r.reason}" if r.reason else "")
                           for r in sel if r.outcome != "valid" or r.reason or r.first_outcome)  # fmt: skip
        shown = f"{version} *sdist*" if all(r.part == "sdist" for r in sel) else version
        out.append(f"| {repo} | {shown} | {len(sel)} [{held}] | {valid} [{valid_held}] | {base} | {inst} "
                   f"| {_cell(others)} |")  # fmt: skip
    return "\n".join(out) + "\n"


def env_times(records: Iterable[tuple[str, str, str, float]]) -> list[EnvTime]:
    """Build times per repository-version from (repo, version, kind, build_s) of the env store's
    records: the base's (the longest, if rebuilt), the median instance layer."""
    bases: dict[tuple[str, str], float] = {}
    instances: dict[tuple[str, str], list[float]] = defaultdict(list)
    for repo, version, kind, build_s in records:
        key = (repo, version)
        if kind == "base":
            bases[key] = max(bases.get(key, 0.0), build_s)
        else:
            instances[key].append(build_s)
    keys = sorted(set(bases) | set(instances), key=lambda k: (k[0], _version_key(k[1])))
    return [EnvTime(repo=r, version=v, base_s=bases.get((r, v)), instances=len(instances[(r, v)]),
                    instance_s=statistics.median(instances[(r, v)]) if instances[(r, v)] else None)
            for r, v in keys]  # fmt: skip
