"""The report in headless Chromium (Debian's chromium, driven by Playwright): the table
is drawn, sorting and filtering work, and clicking a rollout shows its trajectory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from report_helpers import INSTRUCTION, TASK
from farm.report.html import write_report

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing (scripts/setup.sh installs Debian's chromium)"),
    pytest.mark.timeout(120),
]
playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed (the dev extra)")


def test_click_into_a_rollout(real_run, tmp_path):
    page_path = write_report(real_run, tmp_path / "report.html")
    requests: list[str] = []
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(Path(page_path).as_uri())
            rows = page.locator("#rollouts tbody tr")
            assert rows.count() == 3
            assert page.locator("#groups table.groups tbody tr").count() == 1  # the group's reward spread
            assert "Samples measured" in page.inner_text("#fidelity")  # the run's fidelity, a table
            # sort by reward, descending on the second click: the resolved rollout first
            page.click("th[data-k=reward]")
            page.click("th[data-k=reward]")
            assert rows.first.get_attribute("data-rollout") == f"{TASK}.0"
            page.fill("#filter", "sandbox_error")
            assert rows.count() == 1 and page.inner_text("#count") == "1 of 3 rollouts"
            page.fill("#filter", "")
            # the first page counts the flagged rollouts; a flag's button lists them
            assert "1 of 3 rollouts have a grading flag" in page.inner_text("#flags")
            page.click('#flags button[data-flag="static:sys_modules"]')
            assert rows.count() == 1 and rows.first.get_attribute("data-rollout") == f"{TASK}.1"
            assert "diff_touches_tests, static:sys_modules" in rows.first.inner_text()
            page.select_option("#flag", "")
            assert rows.count() == 3
            page.fill("#filter", "diff_touches")  # the text filter finds flags too
            assert rows.count() == 1
            page.fill("#filter", "")
            page.click(f'#rollouts tbody tr[data-rollout="{TASK}.0"]')
            detail = page.locator("#detail")
            detail.wait_for(state="visible")
            text = detail.inner_text()
            assert f"{TASK}.0" in page.inner_text("#detail-title")
            assert "calc__fix-divide" in text  # the task id
            assert "acme/calc @ 0ff1ce" in text and detail.locator("pre.instruction").inner_text() == INSTRUCTION
            assert "context tokens the engine saw" in detail.locator("table.fidelity").first.inner_text()
            assert '"command": "git status"' in text  # a tool call the model made
            assert "+    return a / b  # </script> safe" in text  # the diff, whole
            assert "tests/test_calc.py::test_divide" in text and "FAIL_TO_PASS" in text
            trained = detail.locator(".seg.output .tr")
            assert trained.count() > 10 and trained.first.is_visible()
            assert trained.first.get_attribute("title").startswith("logprob -")  # logprob on hover
            assert "tool output 0.1: 1 failed" in detail.locator(".seg.context").first.inner_text()
            page.screenshot(path=str(tmp_path / "rollout.png"), full_page=True)
            assert (tmp_path / "rollout.png").stat().st_size > 10_000
            # its artifacts are linked, and the links reach the files next to the run
            link = detail.locator(".artifacts a", has_text="agent.stdout.gz")
            target = (Path(page_path).parent / link.get_attribute("href")).resolve()
            assert target == (real_run / "artifacts" / f"{TASK}.0" / "agent.stdout.gz").resolve() and target.is_file()
            # an infrastructure failure shows its error and traceback first
            page.goto(Path(page_path).as_uri() + f"#r={TASK}.2")
            error = page.locator("#detail pre.error")
            error.wait_for(state="visible")
            assert "Traceback (most recent call last)" in error.inner_text() and "disk full" in error.inner_text()
            page.goto(Path(page_path).as_uri() + f"#r={TASK}.0")
            detail.wait_for(state="visible")
            page.click("#detail button")
            assert rows.first.is_visible() and not detail.is_visible()
            assert errors == []
        finally:
            browser.close()
    assert all(u.startswith("file://") for u in requests), requests  # nothing fetched at view time
