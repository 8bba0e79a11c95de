"""The reference pages' tables name exactly what the code has: the Samples columns
(generated), the rollouts columns, the grading report's fields, the CLI's commands. (The
configuration reference is generated: tests/test_config_reference.py.)"""

from __future__ import annotations

import argparse
import re

from doc_snippets import DOCS


def _section(page: str, start: str, end: str | None = None) -> str:
    text = (DOCS / page).read_text()
    i = text.index(start)
    return text[i:text.index(end, i)] if end else text[i:]


def _table_names(section: str) -> set[str]:
    """The backticked names in the first cell of each table row."""
    return {n for cell in re.findall(r"^\| (.+?) \|", section, re.M) for n in re.findall(r"`(\w+)`", cell)}


def test_the_samples_column_table_is_what_the_schema_says():
    """docs/reference/trajectories.md's column table is generated from SAMPLE_SCHEMA (names,
    types, nullability) and farm.trajectory.columns' descriptions: the committed page is it."""
    from farm.trajectory import SAMPLE_SCHEMA
    from farm.trajectory.columns import GENERATE, render_page

    page = (DOCS / "reference" / "trajectories.md").read_text()
    assert page == render_page(page), f"docs/reference/trajectories.md's column table is stale: run `{GENERATE}`"
    listed = _table_names(_section("reference/trajectories.md", "## Columns", "## How a session"))
    assert listed == set(SAMPLE_SCHEMA.names)
    # the other pages link to it rather than keep a table of their own
    assert "trajectories.md#columns" in (DOCS / "reference" / "formats.md").read_text()


def test_rollouts_columns_are_all_named():
    from farm.output.rows import ROLLOUT_SCHEMA

    named = set(re.findall(r"`(\w+)`", _section("reference/formats.md", "Rollouts (", "**Migration rule**")))
    assert set(ROLLOUT_SCHEMA.names) - named == set(), "docs/reference/formats.md's rollouts columns are stale"


def test_grading_report_table_lists_every_field():
    from farm.grading import GradingReport

    listed = _table_names(_section("reference/grading.md", "## The grading report"))
    assert listed == set(GradingReport.model_fields), "docs/reference/grading.md's grading report table is stale"


def test_cli_page_has_every_command():
    from farm.cli import build_parser

    page = (DOCS / "reference" / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"farm {name}" for name in sub.choices if f"## farm {name}\n" not in page]
    for name, parser in sub.choices.items():  # and each sub-command (farm envs build, farm config show, ...)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"farm {name} {s}" for s in action.choices if f"farm {name} {s}" not in page]
    assert missing == [], f"docs/reference/cli.md lacks: {missing}"


def test_the_quickstarts_sample_output_is_what_farm_run_prints():
    """docs/quickstart.md shows a run of `bash scripts/run.sh` (lines cut): its first line
    names the run id configs/local.yaml gives and the directory, its progress lines have the
    driver's shape, and its table's rows are the summary table's, in its order."""
    from farm.config import load_config
    from farm.output.groups import GROUPS_OF_ONE
    from farm.output.rows import RolloutSummary
    from farm.run.summary import CumulativeSummary, SummaryTally, summary_table

    text = (DOCS / "quickstart.md").read_text()
    block = text[text.index("## What you see"):text.index("## Look at the run")]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```\n")].splitlines()
    cfg = load_config(DOCS.parent / "configs" / "local.yaml")
    assert re.fullmatch(rf"farm run {cfg.run_id}: \d+ rollouts to run into {cfg.output.dir}", block[0]), block[0]
    assert cfg.rollout.n_samples == 1 and block[1] == f"note: {GROUPS_OF_ONE}"  # the demo's groups of one, said
    progress = [ln for ln in block if ln.startswith("[")]
    assert progress and all(re.fullmatch(r"\[\d+/\d+\] \S+\.\d+ completed reward=1 turns=\d+ [\d.]+s \| in flight \d+, "
                                         r"\d+s elapsed, completed=\d+", ln) for ln in progress), progress  # fmt: skip
    shown = [cells[1].strip() for ln in block if ln.startswith("│") and (cells := ln.split("│"))[1].strip()]
    summary = SummaryTally.of([RolloutSummary(rollout_id="t.0", group_id="t", task_id="t", status="completed",
                                              reward=1.0, started_at=1.0, finished_at=2.0)]).summary(
        cfg.run_id, planned=1, wall_s=3.0).model_copy(update={
            "cumulative": CumulativeSummary(rollouts=1, by_class={"policy": 1}, invocations=1),
            "fidelity": {"samples_measured": 1, "context_tokens": 9, "differing_tokens": 0, "differing_pct": 0.0,
                         "samples_with_differences": 0}})  # fmt: skip
    table = summary_table(summary)
    labels = [c.strip() for c in table.columns[0].cells]
    assert table.title == f"farm run {cfg.run_id}"
    assert shown and all(label in labels for label in shown), set(shown) - set(labels)
    assert [label for label in labels if label in shown] == shown  # in the table's order
