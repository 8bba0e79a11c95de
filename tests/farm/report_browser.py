"""Open a run's report in headless Chromium (Debian's chromium, driven by Playwright) and
click into one rollout: what its page shows. Shared by the end-to-end run's test."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def browser_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(CHROMIUM)


def open_rollout(page_path: Path, rollout_id: str, screenshot: Path) -> dict[str, Any]:
    """Click ``rollout_id``'s row; return its page's text, title, trained spans, artifact links."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            page.click(f'#rollouts tbody tr[data-rollout="{rollout_id}"]')
            detail = page.locator("#detail")
            detail.wait_for(state="visible")
            trained = detail.locator(".seg.output .tr")
            # The viewport, not the full page: a 44K-token prompt makes the full page tens of
            # thousands of pixels tall, and rendering that took over 30 s on a loaded CI machine.
            page.screenshot(path=str(screenshot), timeout=120_000)
            return {
                "title": page.inner_text("#detail-title"), "text": detail.inner_text(), "errors": errors,
                "trained": trained.count(), "trained_visible": trained.count() > 0 and trained.first.is_visible(),
                "trained_text": "".join(trained.all_inner_texts()),
                "artifacts": [a.inner_text() for a in detail.locator(".artifacts a").all()],
            }  # fmt: skip
        finally:
            browser.close()
