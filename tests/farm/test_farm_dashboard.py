"""farm's Grafana dashboard against real parts, without Grafana: a real Prometheus (Debian's
/usr/bin/prometheus) scrapes a real local Ray's metrics export port while a small farm run
(real Ray actors, real LocalSandboxes, MeteredParts for the CLI / gateway / engine) goes,
then EVERY panel's query of the generated dashboard is evaluated through Prometheus's HTTP
API: a panel whose query returns nothing drawable is a broken panel."""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import ray
from rich.console import Console

import farm_helpers
from farm.actors import dashboard
from farm.config import FarmConfig
from farm import Farm
from farm.tasks.model import Task
from testkit.waits import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SCREENSHOT_ENV = "FARM_DASHBOARD_SCREENSHOT"  # set to a .png path to also picture Prometheus's graph page


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def ray_with_metrics_port():
    port = _port()
    old = os.environ.get("RAY_metrics_report_interval_ms")
    os.environ["RAY_metrics_report_interval_ms"] = "1000"  # Ray's default 10 s would outlast the run
    ray.init(num_cpus=2, include_dashboard=False, namespace="farm", log_to_driver=False, _metrics_export_port=port)
    ray.cloudpickle.register_pickle_by_value(farm_helpers)
    yield port
    ray.shutdown()
    if old is None:
        os.environ.pop("RAY_metrics_report_interval_ms", None)
    else:
        os.environ["RAY_metrics_report_interval_ms"] = old


@pytest.fixture(scope="module")
def prometheus(ray_with_metrics_port, tmp_path_factory):
    if not os.path.exists(PROMETHEUS):
        pytest.skip("prometheus is not installed (scripts/setup.sh installs Debian's)")
    work = tmp_path_factory.mktemp("prometheus")
    (work / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n- job_name: ray\n  static_configs:\n"
        f"  - targets: ['127.0.0.1:{ray_with_metrics_port}']\n"
    )
    port = _port()
    url = f"http://127.0.0.1:{port}"
    log = open(work / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError((work / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.2)  # poll: the loop's deadline bounds the wait
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _tasks(log_dir: Path) -> list[Task]:
    md = {"log_dir": str(log_dir), "version": 0}
    specs = [  # staggered: the rollouts finish over several scrapes, so rates have something to show
        {"reward": 1.0, "agent_s": 1.0, "infra_fail_attempts": 1}, {"reward": 0.0, "agent_s": 0.8},
        {"reward": 1.0, "agent_s": 1.2}, {"reward": 1.0, "agent_s": 0.5, "flags": ["tool_parse_error"]},
        {"reward": 0.0, "agent_s": 0.9, "truncate": True}, {"reward": 1.0, "agent_s": 0.4, "engine_error": True},
        {"reward": 1.0, "agent_s": 0.3}, {"reward": 0.0, "agent_s": 0.6},
    ]  # fmt: skip
    return [Task(id=f"t{i}", instruction="x", metadata={**md, **s}) for i, s in enumerate(specs)]


def _query_range(prom: str, expr: str, start: float, end: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1"})
    body = _get(f"{prom}/api/v1/query_range?{q}")
    assert body["status"] == "success", body
    return body["data"]["result"]


def _drawable(result: list[dict]) -> bool:
    """Some series has a finite point (NaN / Inf draw nothing)."""
    return any(math.isfinite(float(v)) for series in result for _, v in series["values"])


def test_every_panel_query_returns_data_from_a_real_run(prometheus, tmp_path):
    """In continuous mode (farm.Farm): its actors stay up until stop(), so their last
    observations reach Prometheus before anything is torn down."""
    cfg = FarmConfig.model_validate({
        "run_id": "dash",
        "sandbox": {"local": {"base_dir": str(tmp_path / "sandboxes")}},
        "rollout": {"concurrency": 2, "timeout_s": 120, "infra_retries": 1, "retry_backoff_s": 0.1},
        "ray": {"num_sandbox_actors": 2, "reducer_flush_s": 0.2},
        "stream": {"max_ahead": 4},  # the last four rollouts start only once the first four are handed out
        "output": {"dir": str(tmp_path / "out")},
    })  # fmt: skip
    tasks = _tasks(tmp_path)
    start = time.time() - 1
    with Farm(cfg, tasks=tasks, parts_factory=farm_helpers.MeteredParts, console=Console(quiet=True)) as farm:
        # Before the first four are handed out (and so before the last four start, max_ahead 4),
        # Prometheus has scraped both actors' sandbox-create series: the last four creates then
        # raise a series it has seen, so the create-time panels' rate has an increase to show
        # (a series whose every observation predates its first scrape rates 0 throughout).
        _wait_for(prometheus, 'sum(ray_farm_sandbox_create_s_count{run_id="dash"})', 4)
        groups = farm.next_groups(4, timeout=120)
        # A trainer's weight update, as Farm.update_weights stamps it (no engine here to load weights into):
        # the rest of the rollouts began under version 0 and are recorded under 1, staleness 1.
        ray.get(farm._actors.reducer.set_policy_version.remote(1))
        farm._dispatcher.set_policy_version(1)
        groups += list(farm.groups())
        assert sorted(g.group_id for g in groups) == sorted(t.id for t in tasks)
        # Ray exports every second and Prometheus scrapes every second: wait for the last rollout.
        _wait_for(prometheus, 'sum(ray_farm_rollouts_total{run_id="dash"})', len(tasks))
        # a rate needs two samples: a series that first appeared in the last scrape waits for its second
        wait_until(lambda: _check_panels(prometheus, start, time.time() + 1) or True, timeout_s=60,
                   interval_s=0.5, what="every panel drawable")  # fmt: skip
    assert farm.summary.by_status == {"completed": 7, "truncated": 1}


def _wait_for(prometheus: str, expr: str, value: float) -> None:
    """Until Prometheus's instant value of ``expr`` reaches ``value``."""

    def reached() -> bool:
        got = _get(f"{prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")["data"]["result"]
        return bool(got) and float(got[0]["value"][1]) >= value

    wait_until(reached, timeout_s=60, interval_s=0.5, what=f"Prometheus sees {expr} reach {value}")


def _check_panels(prometheus: str, start: float, end: float) -> None:
    broken = []
    for panel in dashboard.panels():
        for query in panel.queries:
            expr = dashboard.promql(query.expr, run_id="dash", window="10s")
            if not _drawable(_query_range(prometheus, expr, start, end)):
                broken.append(f"{panel.title} [{query.legend}]: {expr}")
    assert not broken, "panels with no data:\n" + "\n".join(broken)

    # and the numbers are this run's: 5 of 8 policy outcomes resolved, 1 truncated
    def last(expr: str) -> float:
        res = _query_range(prometheus, dashboard.promql(expr, run_id="dash"), end - 1, end)
        assert res, f"no value now (a gauge no longer set?): {expr}"
        return float(res[0]["values"][-1][1])

    panel = {p.title: p.queries[0].expr for p in dashboard.panels()}
    assert last(panel["Resolved rate"]) == 5 / 8 and last(panel["Truncated share"]) == 1 / 8
    assert last(panel["Rollouts recorded"]) == 8
    assert last(panel["Weight version"]) == 1
    assert last('sum(ray_farm_rollout_staleness_sum{run_id="dash"})') == 4  # the four recorded after the update
    if os.environ.get(SCREENSHOT_ENV):
        shown = ["Rollouts finished / min, by status", "In flight, per sandbox actor", "Tokens / s", "Weight version"]
        exprs = [dashboard.promql(panel[t], run_id="dash", window="10s") for t in shown]
        _screenshot(prometheus, exprs, Path(os.environ[SCREENSHOT_ENV]))


def _screenshot(prom: str, exprs: list[str], path: Path) -> None:
    """Prometheus's own (classic) graph page of some panels' queries: the picture in docs/."""
    from playwright.sync_api import sync_playwright

    from report_browser import ARGS, CHROMIUM

    params = {}
    for i, expr in enumerate(exprs):
        params.update({f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.range_input": "20s"})
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(f"{prom}/classic/graph?{urllib.parse.urlencode(params)}")
            page.wait_for_function(f"document.querySelectorAll('.graph_area svg').length >= {len(exprs)}",
                                   timeout=30_000)  # fmt: skip
            page.add_style_tag(content=".navbar { position: static !important }")  # not mid-page in a full shot
            page.wait_for_timeout(500)
            page.screenshot(path=str(path), full_page=True)
        finally:
            browser.close()
