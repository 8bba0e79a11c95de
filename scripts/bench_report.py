#!/usr/bin/env python
"""`farm report` on a synthetic 1,000-rollout run (not a test).

The run is written through the real writer path: the in-process ``ReducerActor``
(linearize -> Sample shards + manifest -> rollouts table), each rollout a ``TurnTree``
of ``--turns`` turns whose ids are real text (a task prompt, tool calls in the hermes
format, tool output) encoded by the builtin ``farm-test`` tokenizer (built offline), a
grading report with FAIL_TO_PASS / PASS_TO_PASS results, a diff, timings and its
per-rollout artifacts. Then
``farm report`` renders it once, timed, and (when Debian's chromium and Playwright are
there) headless Chromium opens it: time until the 1,000-row table is drawn, and until one
rollout's page is shown after a click (its blob is parsed only then). Prints the write
time, the render time, the report's size, the open times and a last ``name=value`` line.

    python scripts/bench_report.py [--rollouts 1000] [--turns 6]

Last line: ``bench_report: rollouts=… report_s=… report_mb=… open_table_s=… open_rollout_s=…``
(the open times ``na`` where Chromium or Playwright is missing). ``--quick``: the smallest
size, which the test suite runs (``tests/scripts/test_scripts_benches.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import yaml


def build_run(out: Path, n: int, turns: int, tok_dir: Path) -> None:
    from farm.actors.reducer import ReducerActor
    from farm.config import FarmConfig
    from farm.output.artifacts import build_artifacts, turns_jsonl
    from farm.rollout.model import RolloutResult
    from farm.output.rows import counts_of
    from farm.status import RolloutStatus
    from farm.modeltext.tokenizer import load_tokenizer
    from farm.trajectory.tree import TurnTree

    tok = load_tokenizer(str(tok_dir))  # as farm loads it (AutoTokenizer's mapping imports torch: seconds)
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    rng = random.Random(0)
    cfg = FarmConfig.model_validate({"run_id": "bench", "output": {"dir": str(out)}, "ray": {"reducer_flush_s": 1.0}})
    (out / "run_config.yaml").write_text(yaml.safe_dump({"run_id": "bench", "engine": {"tokenizer": str(tok_dir)}}))

    async def main() -> None:
        red = ReducerActor(cfg, metrics=False)
        pending = []
        for i in range(n):
            task = f"repo__task-{i // 4:04d}"
            tree = TurnTree(f"s{i}")
            parent = None
            for k in range(turns):
                prompt = enc(f"<|im_start|>user\nFix the failing test in module_{i}.py, task {task}.<|im_end|>\n"
                             "<|im_start|>assistant\n") if parent is None else enc(
                    f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{'line of output ' * rng.randint(5, 40)}"
                    f"</tool_response><|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
                call = json.dumps({"name": "Bash", "arguments": {"command": f"pytest -q tests/test_{k}.py"}})
                out_ids = enc(f"Let me check step {k}.\n<tool_call>\n{call}\n</tool_call>")
                rec = tree.append(parent_id=parent, prompt_delta_ids=prompt, output_ids=out_ids,
                                  output_logprobs=[-rng.random() for _ in out_ids], finish_reason="stop")
                parent = rec.turn_id
            reward = float(rng.random() < 0.4)
            status = RolloutStatus.COMPLETED if i % 50 else RolloutStatus.TIMEOUT
            grading = {"resolved": reward == 1.0, "fail_to_pass": {f"tests/test_a.py::test_{j}": "PASSED" if reward else "FAILED" for j in range(3)},
                       "pass_to_pass": {f"tests/test_b.py::test_{j}": "PASSED" for j in range(20)}}  # fmt: skip
            result = RolloutResult(
                run_id="bench", rollout_id=f"{task}.{i % 4}", group_id=task, task_id=task, sample_index=i % 4,
                harness="claude_code", model="farm-policy", status=status, reason="", reward=reward, grading=grading,
                diff="".join(f"diff --git a/m{i}.py b/m{i}.py\n@@ -1,3 +1,3 @@\n-old line {j}\n+new line {j}\n" for j in range(8)),
                agent_log_tail='{"type":"result"}\n' * 20, counts=counts_of(tree),
                timings={"create": rng.random(), "prepare": 2 * rng.random(), "agent": 30 * rng.random(), "grade": 5 * rng.random()},
                sandbox_id=f"sb-{i}", started_at=100.0, finished_at=100.0 + 40 * rng.random(), tree=tree,
            )  # fmt: skip
            result.artifacts = build_artifacts(result.rollout_id, {  # as the sandbox actor sends them
                "agent.stdout": result.agent_log_tail * 10, "turns.jsonl": turns_jsonl(tree), "diff.patch": result.diff,
                "grading.json": json.dumps(grading)}, cap=cfg.artifacts.max_bytes_per_rollout, index={"attempt": 1})  # fmt: skip
            pending.append(asyncio.ensure_future(red.submit(result)))
        await asyncio.gather(*pending)
        await red.close()

    asyncio.run(main())


def open_in_browser(page: Path, n: int) -> tuple[float, float] | None:
    """(seconds until the table shows ``n`` rows, seconds to open one rollout), or None."""
    import os

    chromium = "/usr/bin/chromium"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not os.path.exists(chromium):
        return None
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 900})
            t0 = time.perf_counter()
            tab.goto(page.as_uri())
            tab.wait_for_function(f"document.querySelectorAll('#rollouts tbody tr').length === {n}")
            t1 = time.perf_counter()
            tab.locator("#rollouts tbody tr").nth(n // 2).click()
            tab.locator("#detail .seg.output").first.wait_for(state="visible")
            t2 = time.perf_counter()
        finally:
            browser.close()
    return t1 - t0, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=1000)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--cache-dir", default=None, help="where the builtin tokenizer is built (default: farm's cache)")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    if args.quick:
        args.rollouts, args.turns = 8, 2
    from farm.modeltext.tokenizer import resolve_tokenizer
    from farm.report.html import write_report

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok_dir = Path(resolve_tokenizer("builtin:farm-test", args.cache_dir))
        out = root / "run"
        out.mkdir()
        t0 = time.perf_counter()
        build_run(out, args.rollouts, args.turns, tok_dir)
        t1 = time.perf_counter()
        dest = write_report(out, root / "report.html")
        t2 = time.perf_counter()
        size = dest.stat().st_size
        print(f"wrote {args.rollouts} rollouts x {args.turns} turns through ReducerActor in {t1 - t0:.1f}s")
        print(f"farm report: {t2 - t1:.2f}s, {size / 1e6:.2f} MB ({size / args.rollouts / 1e3:.1f} kB per rollout)")
        opened = open_in_browser(dest, args.rollouts)
        if opened is not None:
            print(f"chromium: table of {args.rollouts} rows drawn {opened[0]:.2f}s after navigation, "
                  f"one rollout's page {opened[1]:.2f}s after its click")
        table_s, rollout_s = (f"{x:.2f}" for x in opened) if opened else ("na", "na")
        print(f"bench_report: rollouts={args.rollouts} report_s={t2 - t1:.2f} report_mb={size / 1e6:.2f} "
              f"open_table_s={table_s} open_rollout_s={rollout_s}")


if __name__ == "__main__":
    main()
