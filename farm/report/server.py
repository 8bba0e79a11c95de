"""``farm view``: the report served on 127.0.0.1, re-rendered when the run changes.

The page is rendered again only when one of the files it reads changed (the two
manifests, summary.json, run_config.yaml: their size and mtime), so a reload of a run
in progress shows what became durable since, and a reload of a finished run costs a
stat of four files. Rendering runs in a thread, one at a time, off the event loop.

A rollout's artifacts (gzip files on disk) are served decompressed under their own
names (``/artifacts/<rollout>/agent.stdout``; the ``.gz`` name too), shown in the browser:
JSON as ``application/json``, everything else (logs, JSONL, the diff) as UTF-8 text.
"""

from __future__ import annotations

import asyncio
import gzip
import os
from pathlib import Path

from aiohttp import web

from farm.report.html import render_report
from farm.output.artifacts import ARTIFACTS_DIR

PAGE = web.AppKey("page", "ReportPage")
WATCHED = ("manifest.jsonl", "rollouts.manifest.jsonl", "summary.json", "run_config.yaml")


def _stamp(out: Path) -> tuple[tuple[int, int] | None, ...]:
    stamps = []
    for name in WATCHED:
        try:
            st = os.stat(out / name)
            stamps.append((st.st_size, st.st_mtime_ns))
        except FileNotFoundError:
            stamps.append(None)
    return tuple(stamps)


class ReportPage:
    def __init__(self, out: Path, tokenizer: str | None = None) -> None:
        self.out, self.tokenizer = out, tokenizer
        self.renders = 0
        self._stamp: tuple | None = None
        self._html = ""
        self._lock = asyncio.Lock()

    async def html(self) -> str:
        async with self._lock:
            stamp = _stamp(self.out)
            if stamp != self._stamp:
                self._html = await asyncio.to_thread(render_report, self.out, tokenizer=self.tokenizer, served=True)
                self._stamp = stamp
                self.renders += 1
            return self._html


def make_app(out: str | Path, tokenizer: str | None = None) -> web.Application:
    page = ReportPage(Path(out), tokenizer)

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=await page.html(), content_type="text/html", headers={"Cache-Control": "no-store"})

    async def artifact(request: web.Request) -> web.Response:
        """One artifact file of one rollout, decompressed, with the content type of what it
        holds (the page links them by their names without ``.gz``)."""
        d, name = request.match_info["dir"], request.match_info["name"]
        root = page.out / ARTIFACTS_DIR / d
        if d.startswith(".") or name.startswith(".") or "/" in d or "/" in name:
            raise web.HTTPNotFound(text=f"no artifact {d}/{name}")
        path = next((p for p in (root / name, root / f"{name}.gz") if p.is_file()), None)
        if path is None:
            raise web.HTTPNotFound(text=f"no artifact {d}/{name}")
        data = await asyncio.to_thread(path.read_bytes)
        if path.suffix == ".gz":
            data = await asyncio.to_thread(gzip.decompress, data)
        shown = path.name.removesuffix(".gz")
        kind = "application/json" if shown.endswith(".json") else "text/plain"
        return web.Response(body=data, content_type=kind, charset="utf-8", headers={
            "Content-Disposition": f'inline; filename="{shown}"', "X-Content-Type-Options": "nosniff"})  # fmt: skip

    app = web.Application()
    app[PAGE] = page
    app.router.add_get("/", index)
    app.router.add_get("/artifacts/{dir}/{name}", artifact)
    return app

