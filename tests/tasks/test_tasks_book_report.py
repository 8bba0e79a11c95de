"""The recipe book's measurement on real SWE-bench rows (farm/tasks/book_report.py): the
committed results are well-formed and add up, and the docs page is what they make. The
figures themselves are measured by scripts/validate_book.py on a machine with the mirrors,
not here (no mirrors in CI)."""

from __future__ import annotations

from pathlib import Path

from farm.tasks.book_report import (
    GENERATE, PAGE_PATH, RESULTS_PATH, BookResults, RowResult, counts, heldout_figure, render_markdown, summary_line,
)  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]


def _row(i: str, outcome: str, part: str = "fix", reason: str = "", repo: str = "a/b", version: str = "1.0") -> RowResult:
    return RowResult(id=i, repo=repo, version=version, part=part, outcome=outcome, reason=reason)


def test_the_summary_line_counts_the_published_rows_and_the_held_out_part_apart() -> None:
    rows = [_row("1", "valid"), _row("2", "invalid", reason="x"), _row("3", "valid", "heldout"),
            _row("4", "skipped", "heldout", "needs graphviz"), _row("5", "incomplete_mirror", "heldout", "no mirror"),
            _row("6", "valid", "sdist", repo="django/django", version="4.2")]  # fmt: skip
    assert heldout_figure(rows) == (1, 2)  # the held-out rows whose tree is complete: a skipped one counts, not valid
    assert summary_line(rows, 12.4) == ("validate_book: rows=5 valid=2 invalid=1 skipped=1 incomplete_mirror=1 "
                                        "heldout_valid=1/2 seconds=12")  # fmt: skip
    page = render_markdown(BookResults(measured="here", rows_file="r", split="s", seconds=1, summary="line", rows=rows))
    assert "| django/django | 4.2 *sdist* | 1 [0] | 1 [0] |" in page and "| from PyPI sdists | 1 | 1 |" in page
    assert "4 (held out): skipped: needs graphviz" in page and "| all published | 5 | 2 | 1 | 1 | 1 | 2/4 (50.0%) |" in page


def test_a_held_out_row_re_run_after_its_failure_was_seen_counts_with_its_first_outcome() -> None:
    """A change tuned on a held-out row's failure is no result on it: the held-out figure keeps the
    row's first outcome, the page shows both and the figure with the re-runs apart."""
    rows = [_row("1", "valid", "heldout"), _row("2", "invalid", "heldout", "x"),
            RowResult(id="3", repo="a/b", version="1.0", part="heldout", outcome="valid", first_outcome="invalid")]
    assert heldout_figure(rows) == (1, 3)
    assert "heldout_valid=1/3" in summary_line(rows, 1.0) and "valid=2 invalid=1" in summary_line(rows, 1.0)
    page = render_markdown(BookResults(measured="here", rows_file="r", split="s", seconds=1, summary="line", rows=rows))
    assert "| held out (first runs) | 3 | 1 | 2 | 0 | 0 | 1/3 (33.3%) |" in page
    assert "| held out (re-runs after a failure was seen included) | 3 | 2 | 1 | 0 | 0 | 2/3 (66.7%) |" in page
    assert "3 (held out; first run invalid, then re-run after a change made once its failure was seen): valid" in page


def test_a_held_out_round_found_later_has_its_own_figure_by_first_runs() -> None:
    """Rows held out in a later round ran after every fix made before it: the page shows what the book,
    as it now is, does on them, apart from the earlier held-out rows (which the fixes saw fail)."""
    rows = [_row("1", "invalid", "heldout", "x"), _row("2", "valid", "heldout"),
            RowResult(id="3", repo="a/b", version="1.0", part="heldout", outcome="valid", heldout_round="later"),
            RowResult(id="4", repo="a/b", version="1.0", part="heldout", outcome="valid", first_outcome="invalid",
                      heldout_round="later"),
            RowResult(id="5", repo="a/b", version="1.0", part="heldout", outcome="valid", heldout_round="later")]
    page = render_markdown(BookResults(measured="here", rows_file="r", split="s", seconds=1, summary="line", rows=rows))
    assert "| held out, round later (first runs) | 3 | 2 | 1 | 0 | 0 | 2/3 (66.7%) |" in page
    assert "| held out (first runs) | 5 | 3 | 2 | 0 | 0 | 3/5 (60.0%) |" in page
    assert heldout_figure(rows) == (3, 5)  # the last line counts every held-out row


def test_the_committed_results_are_well_formed_and_the_page_is_made_of_them() -> None:
    results = BookResults.model_validate_json((ROOT / RESULTS_PATH).read_text())
    assert (ROOT / PAGE_PATH).read_text() == render_markdown(results), f"{PAGE_PATH} is stale: run `{GENERATE}`"
    assert results.summary == summary_line(results.rows, results.seconds)
    ids = [r.id for r in results.rows]
    assert len(ids) == len(set(ids)) and results.rows
    assert all(r.reason for r in results.rows if r.outcome != "valid"), "every row not valid has its reason"
    assert {r.part for r in results.rows} >= {"fix", "heldout"}
    published = counts(r for r in results.rows if r.part != "sdist")
    assert sum(published.values()) == sum(r.part != "sdist" for r in results.rows)


def test_validate_book_loads_its_rows_with_the_runs_own_loader(tmp_path: Path) -> None:
    """scripts/validate_book.py up to the load (no mirror's content needed): a row of a version the book
    lacks is recorded as skipped, with the loader's reason, and nothing is validated."""
    import json
    import subprocess
    import sys

    row = {"repo": "psf/requests", "instance_id": "psf__requests-1", "base_commit": "0" * 40, "version": "99.9",
           "patch": "diff --git a/x b/x\n", "test_patch": "diff --git a/test_x.py b/test_x.py\n",
           "problem_statement": "p", "FAIL_TO_PASS": '["test_x.py::test_a"]', "PASS_TO_PASS": "[]"}  # fmt: skip
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "mirrors" / "psf__requests.git").mkdir(parents=True)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "validate_book.py"), str(tmp_path / "rows.jsonl"),
         str(tmp_path / "mirrors"), "--out", str(tmp_path / "out"), "--set", f"tasks.cache_dir={tmp_path / 'cache'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (recorded,) = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert recorded["id"] == "psf__requests-1" and recorded["outcome"] == "skipped", recorded
    assert "99.9" in recorded["reason"], recorded
    assert recorded["first_outcome"] is None and recorded["part"] == "fix"
    # held out, then validated again once its failure was seen: the new line keeps the first outcome
    (tmp_path / "split.json").write_text(json.dumps({"heldout": ["psf__requests-1"], "method": "listed"}))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "validate_book.py"), str(tmp_path / "rows.jsonl"),
         str(tmp_path / "mirrors"), "--out", str(tmp_path / "out"), "--set", f"tasks.cache_dir={tmp_path / 'cache'}",
         "--split", str(tmp_path / "split.json"), "--seen", "psf__requests-1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, again = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert again["part"] == "heldout" and again["outcome"] == "skipped" and again["first_outcome"] == "skipped", again
    assert proc.stdout.strip().endswith("heldout_valid=0/1 seconds=" + proc.stdout.strip().rsplit("=", 1)[-1])
    proc = subprocess.run(  # a later rerun of any kind keeps it
        [sys.executable, str(ROOT / "scripts" / "validate_book.py"), str(tmp_path / "rows.jsonl"),
         str(tmp_path / "mirrors"), "--out", str(tmp_path / "out"), "--set", f"tasks.cache_dir={tmp_path / 'cache'}",
         "--split", str(tmp_path / "split.json"), "--rerun", "all"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[-1])["first_outcome"] == "skipped"
