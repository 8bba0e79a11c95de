"""farm's Grafana dashboard, checked without Grafana or Ray: derived from the metric
declarations (no panel reads an undeclared series, no declared series lacks a panel), the
packaged copy and the docs' metric list equal what the code generates, and `farm dashboard
grafana` writes it where Ray's Grafana provisioning reads. (A real Prometheus evaluates every
panel's query against a real run in test_farm_dashboard.py.)"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from farm.actors import dashboard, metrics
from farm.cli import main
from testkit.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "dashboard.md"


def test_packaged_dashboard_is_the_generated_one():
    assert dashboard.PACKAGED.read_text() == dashboard.dashboard_text(), (
        "regenerate: farm dashboard grafana -o farm/actors/grafana")


def test_panels_read_exactly_the_declared_series():
    assert dashboard.unused_metrics() == []
    declared = set()
    for m in metrics.METRICS:
        declared |= {m.series + s for s in ("_bucket", "_sum", "_count")} if m.kind == "histogram" else {m.series}
    assert dashboard.series_used() <= declared, dashboard.series_used() - declared


def test_dashboard_json_is_what_grafana_provisions():
    board = json.loads(dashboard.dashboard_text())
    assert board["uid"] == dashboard.UID and board["title"] == "farm"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "SessionName", "run_id", "window"}
    graphs = [p for p in board["panels"] if p["type"] != "row"]
    assert len(graphs) == len(dashboard.panels())
    for p in graphs:
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        assert p["targets"] and p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            used = set(re.findall(r"\$(\w+)", t["expr"]))
            assert used <= variables and "run_id" in used, (p["title"], t["expr"])
            assert "$" not in dashboard.promql(t["expr"])
    # every panel filters by run and session, so two runs on one cluster never mix
    assert all('run_id=~"$run_id"' in t["expr"] for p in graphs for t in p["targets"])


def test_observations_use_only_declared_labels(monkeypatch):
    """ActorMetrics records a finished rollout under the declared names and labels (Ray
    refuses undeclared tag keys at runtime; this checks it without a Ray)."""
    import farm_helpers
    from farm.status import RolloutStatus

    seen: dict[str, list[dict]] = {}

    class Recorder:
        def __init__(self, spec):
            self.spec = spec

        def _rec(self, value, tags):
            assert set(tags) == set(self.spec.tag_keys), (self.spec.name, tags)
            seen.setdefault(self.spec.name, []).append({**tags, "value": value})

        inc = set = observe = _rec

    monkeypatch.setattr(metrics, "_make", Recorder)
    m = metrics.ActorMetrics("r1", gauge_refresh_s=None)
    from farm.output.rows import counts_of
    from farm.trajectory.tree import TurnTree

    tree = TurnTree("t.0")
    tree.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-0.1], finish_reason="stop",
                timings={"engine_ms": 30.0, "render_ms": 2.0}, flags=["tool_parse_error"], policy_version=1)
    result = farm_helpers.make_result("t.0", reward=1.0).model_copy(update={"tree": tree, "counts": counts_of(tree)})
    result.policy_version_at_finish = 3
    m.observe_rollout(result)
    assert "farm_engine_latency_s" not in seen  # per turn: the sandbox actor that served them, not the reducer
    m.observe_turns(result.tree)
    m.observe_rollout(farm_helpers.make_result("u.0", status=RolloutStatus.SANDBOX_ERROR, reward=0.0, turns=0))
    m.set_in_flight("sandbox-0", 2)
    m.set_policy_version(3)
    assert [s["status"] for s in seen["farm_rollouts"]] == ["completed", "sandbox_error"]
    assert [s["class"] for s in seen["farm_rollouts_by_class"]] == ["policy", "infrastructure"]
    assert [s["value"] for s in seen["farm_resolved"]] == [1]  # the infrastructure failure is not an outcome
    assert seen["farm_rollout_staleness"] == [{"run_id": "r1", "value": 2}]
    assert seen["farm_policy_version"] == [{"run_id": "r1", "value": 3}]
    assert {s["kind"] for s in seen["farm_tokens"]} == {"prompt", "output"}
    assert [s["value"] for s in seen["farm_engine_latency_s"]] == [0.03]
    assert [s["value"] for s in seen["farm_gateway_latency_s"]] == [0.002]
    assert [s["flag"] for s in seen["farm_turn_flags"]] == ["tool_parse_error"]


def test_dashboard_command_writes_where_ray_provisions(tmp_path, monkeypatch, capsys):
    target = tmp_path / "ray-dashboards"
    monkeypatch.setenv("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR", str(target))
    assert main(["dashboard", "grafana"]) == 0
    assert (target / dashboard.FILE_NAME).read_text() == dashboard.PACKAGED.read_text()
    assert main(["dashboard", "grafana", "-o", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / dashboard.FILE_NAME).is_file()
    monkeypatch.delenv("RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR")
    from farm.commands import dashboard as cmd

    monkeypatch.setattr(cmd, "RAY_SESSION_DASHBOARDS", tmp_path / "no-ray-session")
    capsys.readouterr()
    assert main(["dashboard", "grafana"]) == 2
    assert "start the Ray head first, or pass -o DIR" in capsys.readouterr().err
    assert main(["dashboard", "metrics"]) == 0
    assert capsys.readouterr().out == dashboard.metrics_markdown()


def test_docs_page_lists_every_metric():
    page = PAGE.read_text()
    assert dashboard.metrics_markdown() in page, "docs/how-to/dashboard.md: paste `farm dashboard metrics`"
    for row in dashboard.rows():
        assert f"**{row.title}**" in page, row.title
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page):
        assert (PAGE.parent / image).resolve().is_file(), image



def test_gauges_are_set_again_until_closed(monkeypatch):
    """Ray's agent drops a gauge not set within two export intervals, even from a live
    actor (seen here: a gauge set once is gone from the metrics port ~2 s later); farm's
    gauges (in flight, weight version) are set again every GAUGE_REFRESH_S until close()."""
    sets: list[tuple[str, float, dict]] = []

    class Recorder:
        def __init__(self, spec):
            self.name = spec.name

        def set(self, value, tags):
            sets.append((self.name, value, tags))

        inc = observe = set

    monkeypatch.setattr(metrics, "_make", Recorder)
    before = set(threading.enumerate())
    m = metrics.ActorMetrics("r1", gauge_refresh_s=0.05)
    (refresher,) = [t for t in threading.enumerate() if t not in before and t.name == "farm-metrics-gauges"]
    m.set_in_flight("sandbox-0", 2)
    m.set_in_flight("sandbox-0", 1)  # the last value is what is refreshed
    m.set_policy_version(4)
    wait_until(lambda: len([1 for name, _, _ in sets if name == "farm_rollouts_in_flight"]) >= 5,
               what="three refreshes of the in-flight gauge")  # fmt: skip
    m.close()
    refresher.join(timeout=10)
    assert not refresher.is_alive()  # closed: the refresh loop ended, nothing sets a gauge again
    in_flight = [v for name, v, tags in sets if name == "farm_rollouts_in_flight"]
    assert in_flight[:2] == [2, 1] and len(in_flight) >= 5 and set(in_flight[2:]) == {1}
    assert {(v, tuple(sorted(t.items()))) for name, v, t in sets if name == "farm_policy_version"} == {
        (4, (("run_id", "r1"),))}
