"""``farm dashboard grafana|metrics``: farm on the Ray dashboard's Grafana.

- ``grafana [-o DIR]``: write farm's Grafana dashboard (``farm_grafana_dashboard.json``,
  derived from the metric declarations) into DIR. Without ``-o``: the folder Ray's Grafana
  provisioning reads, ``$RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR`` or
  ``/tmp/ray/session_latest/metrics/grafana/dashboards`` (written by the Ray head when it
  starts). ``-o -`` prints the JSON.
- ``metrics``: the exported series as a Markdown table (docs/how-to/dashboard.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

RAY_DASHBOARDS_ENV = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"  # Ray's own variable (metrics_head.py)
RAY_SESSION_DASHBOARDS = Path("/tmp/ray/session_latest/metrics/grafana/dashboards")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="dashboard_command", required=True)
    graf = sub.add_parser("grafana", help="write farm's Grafana dashboard JSON (provisioning-ready)")
    graf.add_argument("-o", "--output", default=None, metavar="DIR",
                      help=f"folder to write it in ('-' prints it; default: ${RAY_DASHBOARDS_ENV}, "
                      f"else {RAY_SESSION_DASHBOARDS})")  # fmt: skip
    sub.add_parser("metrics", help="the series farm exports (Markdown table)")


def _default_dir() -> Path | None:
    env = os.environ.get(RAY_DASHBOARDS_ENV)
    if env:
        return Path(env)
    return RAY_SESSION_DASHBOARDS if RAY_SESSION_DASHBOARDS.is_dir() else None


def run(args: argparse.Namespace) -> int:
    # heavy: aiohttp, numpy, orjson
    from farm.actors import dashboard

    if args.dashboard_command == "metrics":
        sys.stdout.write(dashboard.metrics_markdown())
        return 0
    text = dashboard.dashboard_text()
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output) if args.output else _default_dir()
    if out is None:
        print(f"farm dashboard grafana: no Ray session's Grafana folder ({RAY_SESSION_DASHBOARDS} does not exist "
              f"and {RAY_DASHBOARDS_ENV} is not set): start the Ray head first, or pass -o DIR", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    path = out / dashboard.FILE_NAME
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    print(f"farm dashboard: wrote {path} (Grafana: dashboard uid {dashboard.UID!r}, folder 'Ray' when "
          "provisioned by Ray's grafana.ini)", file=sys.stderr)
    return 0
