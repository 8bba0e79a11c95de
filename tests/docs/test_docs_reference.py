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
