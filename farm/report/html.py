"""The report page: one self-contained HTML file (inline CSS, JS and SVG; nothing is
fetched when it is viewed).

The rollout table is built by the page's script from one JSON blob; each rollout's
detail (its Samples decoded turn by turn, diff, test results, timings, drift) is its own
``<script type="application/json">`` blob, parsed only when its row is opened, so a
1,000-rollout report opens as fast as its table (``scripts/bench_report.py``).
"""

from __future__ import annotations

import json
import os
import time
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from farm.report.data import Decoder, iter_trajectories, load_run, load_tokenizer, summarize, test_results, tokenizer_spec
from farm.report.plots import run_plots


def _blob(obj: Any) -> str:
    # "<" escaped: a blob can hold any text (diffs, tool output) without closing its <script>
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")


def _asset(name: str) -> str:
    return resources.files("farm.report").joinpath(name).read_text()


def _cards(s: dict[str, Any]) -> str:
    cards = [("rollouts", s["rollouts"]), ("resolved", f"{s['resolved']} / {s['policy_outcomes']}"),
             ("resolved rate", f"{s['resolved_rate']:.1%}"), ("mean reward", f"{s['mean_reward']:.3f}"),
             ("turns", s["turns"]), ("prompt tokens", f"{s['prompt_tokens']:,}"),
             ("output tokens", f"{s['output_tokens']:,}"),
             ("duration p50 / p95 / max", f"{s['duration_p50_s']}s / {s['duration_p95_s']}s / {s['duration_max_s']}s")]  # fmt: skip
    cards += [(f"status {k}", v) for k, v in s["by_status"].items()]
    return "".join(f'<div class="card"><div class="cv">{escape(str(v))}</div><div class="ck">{escape(k)}</div></div>'
                   for k, v in cards)  # fmt: skip


def render_report(out: str | Path, *, tokenizer: str | None = None, artifacts_base: str = "") -> str:
    """The report of output directory ``out`` as one HTML string. ``artifacts_base``: the
    output directory as a URL relative to the page ("" when the page is served from it),
    for the links to each rollout's artifact files."""
    out = Path(out)
    data = load_run(out)
    spec, cache_dir = tokenizer_spec(data, tokenizer)
    dec = Decoder(load_tokenizer(spec, cache_dir))
    summary = summarize(data.rows)
    index = {r["rollout_id"]: i for i, r in enumerate(data.rows)}
    blobs: list[str] = []
    with_samples: set[str] = set()
    for rid, samples in iter_trajectories(out, dec, data.skipped):
        i = index.get(rid)
        if i is None:  # Samples durable, its row not yet (between the reducer's two commits)
            continue
        with_samples.add(rid)
        blobs.append(_detail_blob(i, data.extra[rid], samples))
    for rid, i in index.items():  # rollouts without Samples (no session, nothing trained)
        if rid not in with_samples:
            blobs.append(_detail_blob(i, data.extra[rid], []))
    run_id = (data.run_config.get("run_id") or out.name) if data.run_config else out.name
    head = {"run_id": run_id, "out": str(out.resolve()), "tokenizer": spec,
            "generated": time.strftime("%Y-%m-%d %H:%M:%S"), "skipped": data.skipped,
            "artifacts_base": artifacts_base}  # fmt: skip
    plots = "".join(run_plots(data.rows, data.extra))
    raw = (f'<details><summary>summary.json</summary><pre>{escape(json.dumps(data.summary_json, indent=2))}</pre></details>'
           if data.summary_json is not None else '<p class="muted">no summary.json yet (a run in progress)</p>')  # fmt: skip
    skipped = "".join(f"<li>{escape(s)}</li>" for s in data.skipped)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>farm report: {escape(run_id)}</title>
<style>{_asset("report.css")}</style></head>
<body>
<header><h1>farm report: {escape(run_id)}</h1>
<div class="muted">{escape(str(out.resolve()))} · tokenizer {escape(spec)} · generated {head["generated"]}</div>
{f'<ul class="warn">{skipped}</ul>' if skipped else ''}</header>
<main id="overview">
<section class="cards">{_cards(summary)}</section>
{raw}
<section class="plots">{plots}</section>
<section><h2>rollouts</h2>
<div class="filters"><input id="filter" type="search" placeholder="filter: rollout, task, status, reason">
<select id="status"><option value="">all statuses</option>{"".join(f'<option>{escape(k)}</option>' for k in summary["by_status"])}</select>
<span id="count" class="muted"></span></div>
<table id="rollouts"><thead></thead><tbody></tbody></table></section>
</main>
<section id="detail" hidden></section>
<script type="application/json" id="rows">{_blob(data.rows)}</script>
<script type="application/json" id="head">{_blob(head)}</script>
{"".join(blobs)}
<script>{_asset("report.js")}</script>
</body></html>
"""


def _detail_blob(i: int, extra: dict[str, Any], samples: list[dict[str, Any]]) -> str:
    detail = {**extra, "tests": test_results(extra.get("grading")), "samples": samples}
    return f'<script type="application/json" id="r{i}">{_blob(detail)}</script>\n'


def write_report(out: str | Path, dest: str | Path | None = None, *, tokenizer: str | None = None) -> Path:
    """Render and write atomically (a browser reloading it never sees half a file)."""
    dest = Path(dest) if dest is not None else Path(out) / "report.html"
    tmp = dest.with_name(f".{dest.name}.tmp")
    rel = os.path.relpath(Path(out).resolve(), dest.resolve().parent)
    base = "" if rel == "." else Path(rel).as_posix() + "/"
    tmp.write_text(render_report(out, tokenizer=tokenizer, artifacts_base=base), encoding="utf-8")
    tmp.replace(dest)
    return dest
