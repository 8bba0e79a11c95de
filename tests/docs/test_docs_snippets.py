"""Every shell / python snippet on the docs pages (and the README) is run here as it stands,
or marked with what runs it elsewhere or what it needs that this machine lacks
(doc_snippets.py states the convention). The JSON task rows shown load as tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from doc_snippets import ROOT, Block, all_blocks, blocks, marker_problem, pages

RUN_TIMEOUT_S = 240


def _runnable(page: Path) -> list[Block]:
    return [b for b in blocks(page) if b.kind and b.marker is None]


PAGES = [p for p in pages() if _runnable(p)]
# pages whose snippets grade tasks in real sandboxes (farm validate-tasks): over 10 s
SLOW_PAGES = {"docs/how-to/own-tasks.md"}
PAGE_PARAMS = [pytest.param(p, id=str(p.relative_to(ROOT)),
                            marks=[pytest.mark.slow] if str(p.relative_to(ROOT)) in SLOW_PAGES else [])
               for p in PAGES]  # fmt: skip


def test_every_marker_holds():
    marked = [b for b in all_blocks() if b.kind and b.marker]
    problems = [f"{b.where()}: {why}" for b in marked if (why := marker_problem(b))]
    assert marked and problems == [], "\n".join(problems)


def _command(block: Block) -> list[str]:
    if block.kind == "python":
        return [sys.executable, "-c", block.code]
    code = block.code
    if block.lang == "console":  # only the prompted lines are commands
        code = "\n".join(ln[2:] for ln in code.splitlines() if ln.startswith("$ "))
    return ["bash", "-e", "-o", "pipefail", "-c", code]


def run_block(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(cwd / "home"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(_command(block), cwd=cwd, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


@pytest.mark.parametrize("page", PAGE_PARAMS)
def test_page_snippets_run(page, scratch):
    """The page's unmarked blocks, in order, in one scratch checkout (a block may use
    what an earlier one made); each must exit 0."""
    for block in _runnable(page):
        res = run_block(block, scratch)
        assert res.returncode == 0, (
            f"{block.where()} ({block.lang}) exited {res.returncode}: run it here, or mark it "
            f"`<!-- needs: ... -->` / `<!-- tested-by: ... -->`\n--- code\n{block.code}--- stdout\n{res.stdout[-3000:]}"
            f"--- stderr\n{res.stderr[-3000:]}"
        )


def test_task_rows_on_the_pages_load(tmp_path):
    """A JSON block that is a task row (it has an instruction) is a valid row of a task file."""
    from farm.tasks.loaders import load_tasks

    rows = [b for b in all_blocks() if b.lang == "json" and '"instruction"' in b.code]
    assert rows, "the task-row example is gone from the docs"
    for b in rows:
        f = tmp_path / "row.jsonl"
        f.write_text(json.dumps(json.loads(b.code)) + "\n")
        result = load_tasks(f, strict=True, check_requirements=False)
        assert len(result) == 1, f"{b.where()}: {result.errors}"
