"""The docs site: `mkdocs build --strict` passes (a broken link, anchor or include fails
it), and the built site in headless Chromium (Debian's chromium, driven by Playwright):
every page opens without a console error, every internal link and image resolves, and the
search finds a config key."""

from __future__ import annotations

import functools
import html
import re
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from doc_site import build_site
from doc_snippets import ROOT

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
SEARCH_FOR = "max_context_tokens"


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The build the site fixture relies on is strict: a page linking to a page that does
    not exist fails it (so CI fails on one)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# x\n\n[gone](nowhere.md)\n")
    cfg = tmp_path / "mkdocs.yml"
    text = (ROOT / "mkdocs.yml").read_text()
    cfg.write_text(re.sub(r"(?ms)^nav:.*", "", text).replace("docs_dir: docs", f"docs_dir: {docs}"))
    res = build_site(tmp_path / "site", cfg)
    assert res.returncode != 0 and "nowhere.md" in res.stdout + res.stderr


def test_site_builds_with_every_page_in_the_nav(site):
    built = {p.parent.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for md in (ROOT / "docs").rglob("*.md"):
        rel = md.relative_to(ROOT / "docs").with_suffix("").as_posix()
        want = "." if rel == "index" else rel.removesuffix("/index")
        assert want in built, f"{md} was not built"
    assert (site / "how-to" / "dashboard" / "index.html").exists()  # the dashboard work's page slot


def _index_config(site: Path) -> dict:
    import json

    return json.loads((site / "search" / "search_index.json").read_text())["config"]


def _serve(directory: Path) -> ThreadingHTTPServer:
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _ids(path: Path) -> set[str]:
    return {html.unescape(m) for m in re.findall(r'\bid="([^"]+)"', path.read_text())}


def _target(site: Path, url: str) -> Path:
    path = unquote(urlsplit(url).path).lstrip("/")
    f = site / path
    return f / "index.html" if f.is_dir() or path.endswith("/") or not path else f


def broken_links(site: Path, base: str, page_url: str, hrefs: list[str]) -> list[str]:
    """Internal links (same server) whose file, or whose #anchor in that file, is missing."""
    bad = []
    for href in hrefs:
        url = urljoin(page_url, href)
        if not url.startswith(base):
            continue
        f = _target(site, url[len(base):])
        frag = unquote(urlsplit(url).fragment)
        if not f.is_file():
            bad.append(f"{page_url}: {href} -> no {f.relative_to(site)}")
        elif frag and f.suffix == ".html" and frag not in _ids(f):
            bad.append(f"{page_url}: {href} -> no #{frag} in {f.relative_to(site)}")
    return bad


@pytest.mark.slow
def test_site_in_chromium(site):
    pw_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing (scripts/setup.sh installs it)")
    server = _serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    pages = sorted(p.parent.relative_to(site).as_posix() + "/" for p in site.rglob("index.html"))
    pages = [p.removeprefix("./") for p in pages]
    try:
        with pw_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("console", lambda m: m.type == "error" and errors.append(f"{page.url}: {m.text}"))
                page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
                # Each page's search worker indexes the whole site again; the page walk
                # gives it an empty index (the search itself is checked below, on the real one).
                search_index = re.compile(r".*/search/search_index\.json$")
                page.route(search_index, lambda route: route.fulfill(json={"config": _index_config(site), "docs": []}))
                bad: list[str] = []
                for rel in pages:
                    url = base + rel
                    resp = page.goto(url, wait_until="load")
                    assert resp is not None and resp.ok, f"{url}: {resp and resp.status}"
                    hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))")
                    srcs = page.eval_on_selector_all("img[src]", "els => els.map(e => e.getAttribute('src'))")
                    bad += broken_links(site, base, url, hrefs + srcs)
                assert len(pages) > 20 and bad == [], "\n".join(bad)
                # the search (Material's, in a web worker over the built index) finds a config key
                page.unroute(search_index)
                page.goto(base)
                page.fill("input[data-md-component=search-query]", SEARCH_FOR)
                hit = page.locator(".md-search-result__item a[href*='reference/config/']").first
                try:
                    hit.wait_for(state="attached", timeout=30_000)
                except pw_api.TimeoutError:
                    pytest.fail(f"the site search finds no configuration reference entry for {SEARCH_FOR!r}")
                assert SEARCH_FOR in page.inner_text(".md-search-result")
                assert errors == [], "\n".join(errors)
            finally:
                browser.close()
    finally:
        server.shutdown()
