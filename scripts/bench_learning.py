#!/usr/bin/env python
"""Learning benchmark (not a test): do farm's Samples train?

Runs ``examples/train_loop.py --choice K`` as a user would: ``farm.Farm`` in continuous
mode on the choose-one-of-K-fixes family made from the demo tasks (the gold fix is one
of K candidate patches; the real CLI, Claude Code by default, applies the candidate the
model picks; a fresh sandbox grades it), farm's tiny CPU language model behind the
scripted workers (it samples the choice and scores every token), GRPO on farm's
groups, the weights pushed to the workers every step (``update_weights_from_disk``)
under a staleness bound of one version. Every step the trainer recomputes every trained
token's logprob with the weights its turn was generated with and compares it with the
engine's (``train_rollout_logprob_diff``).

``--shuffle-rewards`` is the control: the same run, trained on each group's rewards
permuted among its rollouts (``train_loop.py --shuffle-rewards``), so a rollout's reward no
longer follows its choice; it must stay at chance (``reward_last`` near ``1/K``). Together
they show the rise comes from the rewards. What it does not show: the right candidate is the
last in every task and the choice token's context is alike across tasks, so the model learns
one letter, not to read a task (``docs/how-to/learning.md``).

Reported: the resolved rate (mean reward) of the first and the last ``--window`` steps
(targets: ``reward_last >= reward_first + 0.5``; with ``--shuffle-rewards``, ``reward_last``
within noise of ``chance``; at the start about ``1/K``), the largest
and mean |train - rollout| logprob over every trained token of the run (target
``<= 1e-4``), the wall time. The reward curve is written as an SVG (``--plot``,
``docs/learning_curve.svg`` by default). Last line::

    bench_learning: shuffle_rewards=0|1 steps=… groups_per_step=… chance=… reward_first=… reward_last=… logprob_diff_max=… logprob_diff_mean=… seconds=…

``--quick``: the smallest size, which the test suite runs (``tests/farm/test_train_loop_example.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def svg_curve(rewards: list[float], chance: float, title: str) -> str:
    """A small line plot of the mean reward per step (no plotting library needed)."""
    w, h, left, right, top, bottom = 640, 320, 56, 16, 36, 44
    pw, ph = w - left - right, h - top - bottom
    n = len(rewards)

    def x(i: float) -> float:
        return left + (pw * (i - 1) / max(1, n - 1))

    def y(v: float) -> float:
        return top + ph * (1.0 - v)

    pts = " ".join(f"{x(i + 1):.1f},{y(r):.1f}" for i, r in enumerate(rewards))
    grid = "".join(
        f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#ddd"/>'
        f'<text x="{left - 8}" y="{y(v) + 4:.1f}" font-size="11" text-anchor="end">{v:.2f}</text>'
        for v in (0.0, 0.25, 0.5, 0.75, 1.0)
    )
    ticks = "".join(
        f'<text x="{x(i):.1f}" y="{top + ph + 16}" font-size="11" text-anchor="middle">{i}</text>'
        for i in range(1, n + 1) if n <= 12 or i % max(1, n // 10) == 0 or i == 1
    )
    dots = "".join(f'<circle cx="{x(i + 1):.1f}" cy="{y(r):.1f}" r="2.5" fill="#1f77b4"/>' for i, r in enumerate(rewards))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif">'
        f'<rect width="{w}" height="{h}" fill="white"/>'
        f'<text x="{w / 2}" y="20" font-size="13" text-anchor="middle">{title}</text>{grid}{ticks}'
        f'<line x1="{left}" y1="{y(chance):.1f}" x2="{left + pw}" y2="{y(chance):.1f}" stroke="#d62728" '
        f'stroke-dasharray="5,4"/><text x="{left + pw}" y="{y(chance) - 5:.1f}" font-size="11" fill="#d62728" '
        f'text-anchor="end">chance (1/K)</text>'
        f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>{dots}'
        f'<text x="{left + pw / 2}" y="{h - 8}" font-size="12" text-anchor="middle">training step</text>'
        f'<text x="14" y="{top + ph / 2}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + ph / 2})">mean reward (resolved rate)</text></svg>\n'
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "local.yaml"))
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--groups", type=int, default=2, help="groups per step")
    ap.add_argument("--n", type=int, default=4, help="rollouts per group")
    ap.add_argument("--k", type=int, default=4, help="candidate fixes per task")
    ap.add_argument("--lr", type=float, default=2e-2)
    ap.add_argument("--window", type=int, default=3, help="steps averaged for reward_first / reward_last")
    ap.add_argument("--plot", default=None,
                    help="the reward curve's SVG (default: docs/learning_curve.svg; with --shuffle-rewards none); '' = none")
    ap.add_argument("--shuffle-rewards", action="store_true",
                    help="the control: rewards permuted within each group before training (must stay at chance)")
    ap.add_argument("--out", default=None, help="the run's output directory (default: a temporary one)")
    ap.add_argument("--set", action="append", default=[], help="config overrides passed on")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs (2 steps of one group of 2, no "
                         "plot): its rewards mean nothing")
    args = ap.parse_args()
    if args.plot is None:
        args.plot = "" if args.shuffle_rewards else str(ROOT / "docs" / "learning_curve.svg")
    if args.quick:
        args.steps, args.groups, args.n, args.window, args.plot = 2, 1, 2, 1, ""

    out = Path(args.out or tempfile.mkdtemp(prefix="farm-bench-learning-"))
    cmd = [sys.executable, str(ROOT / "examples" / "train_loop.py"), "--config", args.config, "--out", str(out),
           "--choice", str(args.k), "--steps", str(args.steps), "--groups", str(args.groups), "--n", str(args.n),
           "--lr", str(args.lr), "--set", "ray.include_dashboard=false", *[a for s in args.set for a in ("--set", s)],
           *(["--shuffle-rewards"] if args.shuffle_rewards else [])]
    env = {**os.environ}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    seconds = time.monotonic() - t0
    steps = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith('{"step"')]
    summary = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("train_loop:")), "")
    print(proc.stdout, end="")
    if proc.returncode != 0 or not steps or not summary:
        print(f"bench_learning: the training loop failed (exit {proc.returncode})", file=sys.stderr)
        return 1
    rewards = [s["mean_reward"] or 0.0 for s in steps]
    k = min(args.window, len(rewards))
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    fields = dict(f.split("=", 1) for f in summary.split()[1:])
    diff_max, diff_mean = float(fields["train_rollout_logprob_diff"]), float(fields["train_rollout_logprob_diff_mean"])
    if args.plot:
        from farm.config import load_config

        harness = load_config(args.config, args.set).harness.name
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        title = (f"GRPO on farm groups: choose 1 of {args.k} fixes, {args.groups}x{args.n} rollouts/step "
                 f"({harness}, CPU){', rewards shuffled' if args.shuffle_rewards else ''}")
        Path(args.plot).write_text(svg_curve(rewards, 1.0 / args.k, title))
        print(f"plot: {args.plot}", file=sys.stderr)
    print(f"bench_learning: shuffle_rewards={int(args.shuffle_rewards)} steps={len(steps)} "
          f"groups_per_step={args.groups} chance={1 / args.k:.3f} reward_first={first:.3f} reward_last={last:.3f} "
          f"logprob_diff_max={diff_max:.3g} logprob_diff_mean={diff_mean:.3g} seconds={seconds:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
