"""farm's Grafana dashboard, derived from the metric declarations (``farm.actors.metrics``).

Every query is built from a ``MetricSpec`` (its exported series name, its labels), so a
renamed or removed metric changes or breaks the dashboard here, in code, not silently in
Grafana. The packaged copy (``farm/actors/grafana/farm_grafana_dashboard.json``) is this module's output
(a test compares them); ``farm dashboard grafana -o DIR`` writes it where Ray's Grafana
provisioning looks (``<session>/metrics/grafana/dashboards``).

The dashboard follows Ray's own (``ray.dashboard.modules.metrics``): a ``datasource``
variable, a ``SessionName`` filter, a ``window`` for rates; farm adds ``run_id``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from farm.actors.metrics import (
    BY_CLASS, DURATION, DURATION_SUM, ENGINE_ERRORS, ENGINE_LATENCY, GATEWAY_LATENCY, IN_FLIGHT, METRICS,
    POLICY_VERSION, RESOLVED, RETRIES, REWARD, REWARD_SUM, ROLLOUTS, SANDBOX_CREATE, SHARDS, STALENESS, TOKENS,
    TURN_FLAGS, TURNS, MetricSpec,
)  # fmt: skip
from farm.status import FailureClass, RolloutStatus

UID = "farm-rollouts"
FILE_NAME = "farm_grafana_dashboard.json"
PACKAGED = Path(__file__).with_name("grafana") / FILE_NAME
FILTER = 'run_id=~"$run_id",SessionName=~"$SessionName"'
# Grafana fills these in; anything else that evaluates a panel's query (a test, a user at
# Prometheus's own page) substitutes them with ``promql``.
VARIABLES = {"run_id": ".*", "SessionName": ".*", "window": "1m"}


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat": one number (the last value)
    width: int = 12


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)


def sel(spec: MetricSpec, suffix: str = "", **labels: str) -> str:
    """``series{filter,labels}`` of a spec (``suffix``: a histogram's _bucket / _sum / _count)."""
    if suffix and spec.kind != "histogram":
        raise ValueError(f"{spec.name} is a {spec.kind}: no {suffix} series")
    extra = "".join(f',{k}="{v}"' for k, v in labels.items())
    return f"{spec.series}{suffix}{{{FILTER}{extra}}}"


def rate(spec: MetricSpec, by: str = "", per: int = 1, suffix: str = "", **labels: str) -> str:
    grouping = f" by ({by})" if by else ""
    scaled = f" * {per}" if per != 1 else ""
    return f"sum{grouping}(rate({sel(spec, suffix, **labels)}[$window])){scaled}"


def total(spec: MetricSpec, **labels: str) -> str:
    return f"sum({sel(spec, **labels)})"


def quantile(spec: MetricSpec, q: float) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({sel(spec, '_bucket')}[$window])))"


def _latency(title: str, description: str, *specs: tuple[str, MetricSpec]) -> Panel:
    qs = tuple(Query(quantile(spec, q), f"{name} p{int(q * 100)}") for name, spec in specs for q in (0.5, 0.95))
    return Panel(title, description, qs, unit="s")


_POLICY = {"class": FailureClass.POLICY.value}


def rows() -> tuple[Row, ...]:
    policy_total = total(BY_CLASS, **_POLICY)
    truncated = sel(ROLLOUTS, status=RolloutStatus.TRUNCATED.value)
    return (
        Row("Rollouts", (
            Panel("Rollouts finished / min, by status", "farm_rollouts: every recorded rollout, by status",
                  (Query(rate(ROLLOUTS, "status", 60), "{{status}}"),)),
            Panel("Rollouts finished / min, by class",
                  "policy outcomes (trainable) against infrastructure failures (never trained, retried)",
                  (Query(rate(BY_CLASS, "class", 60), "{{class}}"),)),
            Panel("In flight, per sandbox actor", "rollouts running now (farm_rollouts_in_flight)",
                  (Query(f"sum by (actor) ({sel(IN_FLIGHT)})", "{{actor}}"),)),
            Panel("Retries / min", "attempts beyond the first of recorded rollouts, by class of the outcome",
                  (Query(rate(RETRIES, "class", 60), "{{class}}"),)),
        )),
        Row("Outcomes", (
            Panel("Rollouts recorded", "since the processes started", (Query(total(ROLLOUTS)),), kind="stat", width=6),
            Panel("Resolved rate", "resolved / policy outcomes (infrastructure failures excluded)",
                  (Query(f"{total(RESOLVED)} / {policy_total}"),), unit="percentunit", kind="stat", width=6),
            Panel("Mean reward", "sum of rewards / policy outcomes",
                  (Query(f"{total(REWARD_SUM)} / {policy_total}"),), kind="stat", width=6),
            Panel("Truncated share", "truncated (a turn / context / output budget ran out) / policy outcomes",
                  (Query(f"sum({truncated} or {sel(ROLLOUTS)} * 0) / {policy_total}"),),
                  unit="percentunit", kind="stat", width=6),
            Panel("Mean reward and resolved rate, over the window", "policy outcomes finished within the window",
                  (Query(f"{rate(REWARD_SUM)} / {rate(BY_CLASS, **_POLICY)}", "mean reward"),
                   Query(f"{rate(RESOLVED)} / {rate(BY_CLASS, **_POLICY)}", "resolved rate"),
                   Query(quantile(REWARD, 0.5), "median reward (all rollouts)"))),
            Panel("Share of rollouts by status", "each status's share of the rollouts finished within the window",
                  (Query(f"{rate(ROLLOUTS, 'status')} / scalar({rate(ROLLOUTS)})", "{{status}}"),),
                  unit="percentunit"),
        )),
        Row("Latency", (
            _latency("Turn latency", "per model call: the engine's /generate time, and the gateway's own time",
                     ("engine", ENGINE_LATENCY), ("gateway", GATEWAY_LATENCY)),
            Panel("Rollout wall time", "p50 / p95 of finished rollouts; mean from the exact sums",
                  (Query(quantile(DURATION, 0.5), "p50"), Query(quantile(DURATION, 0.95), "p95"),
                   Query(f"{rate(DURATION_SUM)} / {rate(ROLLOUTS)}", "mean")), unit="s"),
            _latency("Sandbox create time", "from create to a running sandbox", ("create", SANDBOX_CREATE)),
        )),
        Row("Model calls", (
            Panel("Turns / s", "model calls recorded, by harness", (Query(rate(TURNS, "harness"), "{{harness}}"),)),
            Panel("Tokens / s", "prompt (delta) and output tokens", (Query(rate(TOKENS, "kind"), "{{kind}}"),)),
            Panel("Gateway errors and flags / min",
                  "turns the engine failed, and turns the gateway flagged (tool-call parse errors, drift, budgets)",
                  (Query(rate(ENGINE_ERRORS, per=60), "engine errors"),
                   Query(rate(TURN_FLAGS, "flag", 60), "{{flag}}"))),
        )),
        Row("Data and weights", (
            Panel("Shards written", "shards made durable by the reducer, by table",
                  (Query(f"sum by (table) ({sel(SHARDS)})", "{{table}}"),)),
            Panel("Weight version", "the farm's weights (continuous mode: farm.Farm.update_weights)",
                  (Query(f"max({sel(POLICY_VERSION)})", "version"),)),
            Panel("Staleness of recorded rollouts", "weight versions behind when recorded (continuous mode)",
                  (Query(quantile(STALENESS, 0.95), "p95"),
                   Query(f"{rate(STALENESS, suffix='_sum')} / {rate(STALENESS, suffix='_count')}", "mean"))),
        )),
    )  # fmt: skip


def panels() -> list[Panel]:
    return [p for row in rows() for p in row.panels]


def promql(expr: str, **values: str) -> str:
    """A panel's query with Grafana's variables filled in (defaults: every run and session, 1m)."""
    for name, value in {**VARIABLES, **values}.items():
        expr = expr.replace(f"${name}", value)
    return expr


def _panel_json(p: Panel, pid: int, x: int, y: int) -> dict:
    targets = [{"datasource": {"type": "prometheus", "uid": "${datasource}"}, "expr": q.expr,
                "legendFormat": q.legend or "__auto", "refId": chr(ord("A") + i)} for i, q in enumerate(p.queries)]
    out: dict = {
        "id": pid, "type": p.kind, "title": p.title, "description": p.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 5 if p.kind == "stat" else 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": p.unit}, "overrides": []},
        "targets": targets,
    }
    if p.kind == "stat":
        out["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return out


def _variable(name: str, label: str, definition: str) -> dict:
    return {
        "name": name, "label": label, "type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "definition": definition, "query": {"query": definition, "refId": "StandardVariableQuery"},
        "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*", "sort": 2,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }  # fmt: skip


def dashboard() -> dict:
    """The dashboard JSON Grafana provisions (file provider) or imports."""
    out_panels: list[dict] = []
    pid, y = 1, 0
    for row in rows():
        out_panels.append({"id": pid, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                           "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})  # fmt: skip
        pid, y, x, row_h = pid + 1, y + 1, 0, 0
        for p in row.panels:
            if x + p.width > 24:
                x, y, row_h = 0, y + row_h, 0
            panel = _panel_json(p, pid, x, y)
            out_panels.append(panel)
            pid, x, row_h = pid + 1, x + p.width, max(row_h, panel["gridPos"]["h"])
        y += row_h
    windows = ["30s", "1m", "5m", "15m"]
    return {
        "uid": UID, "title": "farm", "tags": ["farm", "ray"], "editable": True, "schemaVersion": 39, "version": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "10s", "graphTooltip": 1,
        "description": "farm's rollouts, latencies, tokens and weights (ray_farm_* series from ray.util.metrics)",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "hide": 0, "current": {}},
            _variable("SessionName", "Ray session", f"label_values({ROLLOUTS.series}, SessionName)"),
            _variable("run_id", "Run", f"label_values({ROLLOUTS.series}, run_id)"),
            {"name": "window", "label": "Window", "type": "interval", "query": ",".join(windows), "auto": False,
             "current": {"selected": True, "text": "1m", "value": "1m"},
             "options": [{"selected": w == "1m", "text": w, "value": w} for w in windows]},
        ]},
        "panels": out_panels,
    }  # fmt: skip


def dashboard_text() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def series_used() -> set[str]:
    """Every series name a panel's query reads."""
    return {name for p in panels() for q in p.queries for name in re.findall(r"\bray_farm_\w+", q.expr)}


def unused_metrics() -> list[str]:
    """Declared metrics no panel shows (a test keeps this empty)."""
    used = series_used()
    suffixes = ("_bucket", "_sum", "_count")
    return [m.name for m in METRICS
            if not ({m.series + s for s in suffixes} if m.kind == "histogram" else {m.series}) & used]  # fmt: skip


def metrics_markdown() -> str:
    """The metric list of docs/how-to/dashboard.md (a test keeps the page equal to it)."""
    lines = ["| series (Prometheus) | kind | labels (and `run_id`) | what |", "|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{lb}`" for lb in m.labels) or "-"
        series = f"`{m.series}_bucket`, `_sum`, `_count`" if m.kind == "histogram" else f"`{m.series}`"
        lines.append(f"| {series} | {m.kind} | {labels} | {m.help} |")
    return "\n".join(lines) + "\n"
