"""The report page: one self-contained HTML file (inline CSS, JS and SVG; nothing is
fetched when it is viewed).

The rollout table is built by the page's script from one JSON blob; each rollout's
detail (its Samples decoded turn by turn, diff, test results, timings, drift, fidelity) is
its own ``<script type="application/json">`` blob, parsed only when its row is opened, so a
1,000-rollout report opens as fast as its table (``scripts/bench_report.py``); so is each
task (id, source, the instruction: shared by the rollouts of its group). The overview is
static HTML: cards (counts, rewards, wall time and throughput), plots, each group's
reward spread, the run's token fidelity as a table.
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
from farm.report.stats import TOTAL_LABELS, fidelity_rows, flag_counts, group_spread, invocations_wall
from farm.report.task import TaskLookup
from farm.output.fidelity import directory_fidelity

GROUPS_OPEN = 50  # the groups table starts folded above this many groups


def _blob(obj: Any) -> str:
    # "<" escaped: a blob can hold any text (diffs, tool output) without closing its <script>
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")


def _asset(name: str) -> str:
    return resources.files("farm.report").joinpath(name).read_text()


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m {s:02d}s" if h else f"{m}m {s:02d}s" if m else f"{seconds:.1f}s"


def _cards(s: dict[str, Any], groups: list[dict[str, Any]]) -> str:
    signal = [g for g in groups if g["n"]]
    flagged = s["flagged"]
    cards = [("rollouts", s["rollouts"]), ("resolved", f"{s['resolved']} / {s['policy_outcomes']}"),
             ("resolved rate", f"{s['resolved_rate']:.1%}"), ("mean reward", f"{s['mean_reward']:.3f}"),
             ("turns", s["turns"]), ("prompt tokens", f"{s['prompt_tokens']:,}"),
             ("output tokens", f"{s['output_tokens']:,}"),
             ("duration p50 / p95 / max", f"{s['duration_p50_s']}s / {s['duration_p95_s']}s / {s['duration_max_s']}s"),
             ("busy time (rollouts running)", _duration(s["busy_s"])),
             ("first start to last end", _duration(s["span_s"])),
             (f"wall time (start-up to exit, {s['invocations']} command{'s' * (s['invocations'] != 1)})",
              _duration(s["wall_s"]) if s["invocations"] else "-"),
             ("rollouts / min (over busy time)", f"{s['rollouts_per_min']:g}"),
             ("turns / s (over busy time)", f"{s['turns_per_s']:g}"),
             ("output tokens / s (over busy time)", f"{s['output_tokens_per_s']:g}"),
             ("groups with reward spread (GRPO signal)", f"{sum(not g['flat'] for g in signal)} / {len(signal)}"),
             ("flagged rollouts (grading flags)", f"{flagged} / {s['rollouts']}")]  # fmt: skip
    cards += [(f"status {k}", v) for k, v in s["by_status"].items()]
    return "".join(f'<div class="card"><div class="cv">{escape(str(v))}</div><div class="ck">{escape(k)}</div></div>'
                   for k, v in cards)  # fmt: skip


def _flags(counts: dict[str, int], flagged: int, total: int) -> str:
    """The grading's flags over the run: how many rollouts have each, each a button that
    filters the rollout table to them (``report.js``)."""
    if not counts:
        return ('<section id="flags"><h2>flags</h2><p class="muted">no rollout has a grading flag '
                '(diff_touches_tests, reward-hack findings, ...)</p></section>')
    buttons = "".join(f'<button class="flag" data-flag="{escape(f)}">{escape(f)} <b>{n}</b></button>'
                      for f, n in counts.items())  # fmt: skip
    return (f'<section id="flags"><h2>flags</h2><p class="muted">{flagged} of {total} rollouts have a grading '
            f'flag (the grader\'s named findings: what the diff touched, reward-hack findings); a click lists '
            f'them below</p><div class="flags"><button class="flag" data-flag="*">any flag <b>{flagged}</b></button>'
            f'{buttons}</div></section>')


def _groups(groups: list[dict[str, Any]]) -> str:
    """Each group's reward spread over its policy outcomes; flat groups (no GRPO signal) first, marked."""
    if not groups:
        return ""
    flat = sum(g["flat"] for g in groups)
    num = lambda v: "" if v is None else f"{v:g}"  # noqa: E731
    rows = "".join(
        f'<tr class="{"flat" if g["flat"] else ""}"><td>{escape(g["group_id"])}</td><td class="num">{g["n"]}</td>'
        f'<td class="num">{num(g["mean"])}</td><td class="num">{num(g["std"])}</td><td class="num">{num(g["min"])}</td>'
        f'<td class="num">{num(g["max"])}</td><td class="num">{g["excluded"] or ""}</td>'
        f'<td>{"all equal: no signal" if g["flat"] else ""}</td></tr>' for g in groups)  # fmt: skip
    opened = " open" if len(groups) <= GROUPS_OPEN else ""
    return (f'<section id="groups"><details{opened}><summary><h2>groups: reward spread (what GRPO trains on)</h2> '
            f'<span class="muted">{flat} of {len(groups)} groups have all rewards equal (every advantage 0); '
            f'over policy outcomes, infrastructure failures excluded</span></summary>'
            f'<table class="groups"><thead><tr><th>group</th><th>rollouts</th><th>mean</th><th>std</th><th>min</th>'
            f'<th>max</th><th>excluded (infra)</th><th></th></tr></thead><tbody>{rows}</tbody></table></details></section>')


def _fidelity(totals: dict[str, Any] | None) -> str:
    rows = fidelity_rows(totals, TOTAL_LABELS) if totals and totals.get("samples_measured") else []
    if not rows:
        return ""
    body = "".join(f'<tr><td>{escape(k)}</td><td class="num">{escape(str(v))}</td></tr>' for k, v in rows)
    return (f'<section id="fidelity"><h2>token fidelity</h2><p class="muted">the context the engine saw vs a fresh '
            f'chat-template render of the same messages (per Sample: open a rollout)</p>'
            f'<table class="kv">{body}</table></section>')  # fmt: skip


def _fidelity_totals(out: Path) -> dict[str, Any] | None:
    try:
        return directory_fidelity(out).totals()
    except Exception:  # noqa: BLE001 - a damaged shard: the rest of the report still renders
        return None


def render_report(out: str | Path, *, tokenizer: str | None = None, artifacts_base: str = "",
                  served: bool = False) -> str:
    """The report of output directory ``out`` as one HTML string. ``artifacts_base``: the
    output directory as a URL relative to the page ("" when the page is served from it),
    for the links to each rollout's artifact files; ``served``: the page is served by
    ``farm view``, which serves them decompressed (the links drop ``.gz``)."""
    out = Path(out)
    data = load_run(out)
    spec, cache_dir = tokenizer_spec(data, tokenizer)
    dec = Decoder(load_tokenizer(spec, cache_dir))
    flags = flag_counts(data.rows)
    flagged = sum(1 for r in data.rows if r["flags"])
    summary = {**summarize(data.rows), **invocations_wall(data.invocations), "flagged": flagged}
    groups = group_spread(data.rows)
    index = {r["rollout_id"]: i for i, r in enumerate(data.rows)}
    task_refs = _task_refs(out, data)
    blobs: list[str] = [f'<script type="application/json" id="t{j}">{_blob(view)}</script>\n'
                        for j, view in enumerate(task_refs.pop("", []))]  # fmt: skip
    with_samples: set[str] = set()
    for rid, samples in iter_trajectories(out, dec, data.skipped):
        i = index.get(rid)
        if i is None:  # Samples durable, its row not yet (between the reducer's two commits)
            continue
        with_samples.add(rid)
        blobs.append(_detail_blob(i, data.extra[rid], samples, task_refs.get(data.rows[i]["task_id"])))
    for rid, i in index.items():  # rollouts without Samples (no session, nothing trained)
        if rid not in with_samples:
            blobs.append(_detail_blob(i, data.extra[rid], [], task_refs.get(data.rows[i]["task_id"])))
    run_id = (data.run_config.get("run_id") or out.name) if data.run_config else out.name
    head = {"run_id": run_id, "out": str(out.resolve()), "tokenizer": spec,
            "generated": time.strftime("%Y-%m-%d %H:%M:%S"), "skipped": data.skipped,
            "artifacts_base": artifacts_base, "served": served}  # fmt: skip
    plots = "".join(run_plots(data.rows, data.extra))
    raw = (f'<details><summary>summary.json (the last invocation; the numbers above are read from the rollouts '
           f'table)</summary><pre>{escape(json.dumps(data.summary_json, indent=2))}</pre></details>'
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
<section class="cards">{_cards(summary, groups)}</section>
<section class="plots">{plots}</section>
{_flags(flags, flagged, len(data.rows))}
{_groups(groups)}
{_fidelity(_fidelity_totals(out))}
{raw}
<section><h2>rollouts</h2>
<div class="filters"><input id="filter" type="search" placeholder="filter: rollout, task, status, reason, flag">
<select id="status"><option value="">all statuses</option>{"".join(f'<option>{escape(k)}</option>' for k in summary["by_status"])}</select>
<select id="flag"><option value="">flagged or not</option><option value="*">any flag ({flagged})</option>{"".join(f'<option value="{escape(f)}">{escape(f)} ({n})</option>' for f, n in flags.items())}</select>
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


def _task_refs(out: Path, data: Any) -> dict[str, Any]:
    """task id -> the index of its task blob; under "" the task views, in index order (the
    first rollout of each task says what it was: one task set per output directory)."""
    lookup = TaskLookup(out, data.run_config)
    refs: dict[str, Any] = {}
    views: list[dict[str, Any]] = []
    for r in data.rows:
        if r["task_id"] in refs:
            continue
        view = lookup.get(r["rollout_id"], r["task_id"])
        refs[r["task_id"]] = len(views) if view is not None else None
        if view is not None:
            views.append(view)
    refs[""] = views
    return refs


def _detail_blob(i: int, extra: dict[str, Any], samples: list[dict[str, Any]], task: int | None = None) -> str:
    detail = {**extra, "tests": test_results(extra.get("grading")), "samples": samples, "task": task}
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
