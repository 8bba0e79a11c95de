"""Inline SVG plots for the report: no plotting library and nothing fetched at view time.

Two shapes cover what the report draws: horizontal bars (a value per label: mean
reward per task, mean seconds per phase) and a histogram (turns per rollout).
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

import numpy as np

WIDTH, BAR_H, LABEL_W = 520, 16, 170


def hbars(title: str, items: list[tuple[str, float]], *, fmt: str = "{:.2f}", vmax: float | None = None,
          limit: int = 40) -> str:
    """Bars of ``items`` (label, value), the first ``limit`` (the caller orders them)."""
    shown = items[:limit]
    top = vmax if vmax is not None else max((v for _, v in shown), default=0.0) or 1.0
    h = 24 + BAR_H * len(shown) + 4
    parts = [f'<svg class="plot" width="{WIDTH}" height="{h}" role="img" aria-label="{escape(title)}">',
             f'<text x="0" y="14" class="pt">{escape(title)}</text>']  # fmt: skip
    span = WIDTH - LABEL_W - 60
    for i, (label, v) in enumerate(shown):
        y = 24 + i * BAR_H
        w = max(0.0, span * v / top)
        short = label if len(label) <= 26 else label[:25] + "\u2026"
        parts.append(f'<text x="{LABEL_W - 4}" y="{y + 12}" class="pl">{escape(short)}<title>{escape(label)}</title></text>'
                     f'<rect x="{LABEL_W}" y="{y + 2}" width="{w:.1f}" height="{BAR_H - 4}" class="pb"/>'
                     f'<text x="{LABEL_W + w + 4:.1f}" y="{y + 12}" class="pv">{fmt.format(v)}</text>')  # fmt: skip
    if len(items) > limit:
        parts.append(f'<text x="0" y="{h - 2}" class="pv">(first {limit} of {len(items)})</text>')
    parts.append("</svg>")
    return "".join(parts)


def histogram(title: str, values: list[float], *, bins: int = 20) -> str:
    """Counts of ``values`` in up to ``bins`` integer-aligned bins."""
    h, plot_h = 150, 110
    parts = [f'<svg class="plot" width="{WIDTH}" height="{h}" role="img" aria-label="{escape(title)}">',
             f'<text x="0" y="14" class="pt">{escape(title)}</text>']  # fmt: skip
    if values:
        lo, hi = int(min(values)), int(max(values)) + 1
        edges = np.linspace(lo, hi, min(bins, hi - lo) + 1)
        counts, edges = np.histogram(values, bins=edges)
        top = int(counts.max()) or 1
        bw = (WIDTH - 40) / len(counts)
        for i, c in enumerate(counts.tolist()):
            bh = plot_h * c / top
            x = 30 + i * bw
            label = f"{edges[i]:.0f}\u2013{edges[i + 1]:.0f}: {c}"
            parts.append(f'<rect x="{x:.1f}" y="{20 + plot_h - bh:.1f}" width="{max(bw - 1, 1):.1f}" height="{bh:.1f}" '
                         f'class="pb"><title>{label}</title></rect>')  # fmt: skip
        parts.append(f'<text x="30" y="{h - 4}" class="pv">{lo}</text>'
                     f'<text x="{WIDTH - 10}" y="{h - 4}" class="pv" text-anchor="end">{hi - 1}</text>'
                     f'<text x="0" y="30" class="pv">{top}</text>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def run_plots(rows: list[dict[str, Any]], extra: dict[str, dict[str, Any]]) -> list[str]:
    """Reward by task (mean, lowest first: what fails shows on top), turns per rollout,
    mean seconds per phase (the rollouts table's ``timings``)."""
    by_task: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_task[r["task_id"]].append(r["reward"] or 0.0)
    rewards = sorted(((t, sum(v) / len(v)) for t, v in by_task.items()), key=lambda kv: (kv[1], kv[0]))
    phases: dict[str, list[float]] = defaultdict(list)
    for e in extra.values():
        for k, v in (e.get("timings") or {}).items():
            if isinstance(v, (int, float)):
                phases[k].append(float(v))
    mean_phase = sorted(((k, sum(v) / len(v)) for k, v in phases.items()), key=lambda kv: -kv[1])
    return [
        hbars("mean reward by task", rewards, vmax=1.0),
        histogram("turns per rollout", [float(r["turns"] or 0) for r in rows]),
        hbars("mean seconds by phase", mean_phase, fmt="{:.2f}s"),
    ]
