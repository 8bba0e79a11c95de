#!/usr/bin/env python
"""bench_samples_read: reading Samples back from a table (``table_to_samples``: what a
trainer's ``GroupReader``, the torch dataset and ``farm inspect`` do for every row).

Two ways, side by side, on the same Arrow tables, best of ``--reps``:

  per_row   the way before: each row validated by constructing a ``Sample`` (pydantic and
            a handful of numpy calls a row), as ``table_to_samples`` did
  columns   as shipped: every invariant checked column-wise once for the table
            (``farm.trajectory.table_checks``), the rows built without a second check

on short rows (``--rows`` Samples of 2 turns, ~200 tokens: the control-plane bench's) and
long ones (64 Samples of 30 turns, ~20K tokens). Both must give the same Samples.
Last line: ``bench_samples_read: short_per_row_us=… short_columns_us=… long_per_row_us=…
long_columns_us=… speedup_short=…`` (microseconds a row).
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from farm.trajectory.schema import (
    _LIST_COLS,
    _SCALAR_COLS,
    SAMPLE_SCHEMA,
    Sample,
    _routing_from,
    samples_to_table,
    table_to_samples,
)


def make_samples(n: int, turns: int, tokens_a_turn: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = 40
        response = turns * tokens_a_turn
        mask = np.tile(np.r_[np.ones(tokens_a_turn // 2, np.uint8), np.zeros(tokens_a_turn - tokens_a_turn // 2, np.uint8)], turns)
        logprobs = np.where(mask == 1, -rng.random(response, dtype=np.float32), 0.0).astype(np.float32)
        out.append(Sample(run_id="bench", task_id=f"t{i // 8}", rollout_id=f"t{i // 8}.{i % 8}", group_id=f"t{i // 8}",
                          sample_index=i % 8, session_id=f"s{i}", harness="claude_code", model="m", group_index=i // 8,
                          policy_version_min=0, policy_version_max=0,
                          tokens=rng.integers(0, 150_000, prompt + response, dtype=np.int32), prompt_length=prompt,
                          response_length=response, loss_mask=mask, rollout_logprobs=logprobs, reward=1.0,
                          num_turns=turns, metadata={"farm": {"turns": turns}, "fidelity": {"ok": True}}))  # fmt: skip
    return out


def per_row(table) -> list[Sample]:
    """``table_to_samples`` as it was: every row through Sample's validation."""
    table = table.select([f.name for f in SAMPLE_SCHEMA]).combine_chunks()
    lists = {}
    for name in _LIST_COLS:
        col = table.column(name).chunk(0)
        lists[name] = (col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False))
    scalars = {name: table.column(name).to_pylist() for name in _SCALAR_COLS}
    metas = table.column("metadata").to_pylist()
    routed = table.column("routed_experts").to_pylist()
    out = []
    for i in range(table.num_rows):
        row = {name: scalars[name][i] for name in _SCALAR_COLS}
        for name, (offs, vals) in lists.items():
            row[name] = vals[offs[i] : offs[i + 1]]
        row["metadata"] = json.loads(metas[i])
        row["routed_experts"] = _routing_from(routed[i], row["metadata"])
        out.append(Sample(**row))
    return out


def best_us_a_row(fn, table, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn(table)
        times.append(time.perf_counter() - t)
    return min(times) / table.num_rows * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192, help="short Samples in the table")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    long_rows = 64
    if args.quick:
        args.rows, args.reps, long_rows = 64, 1, 4
    figures = {}
    for label, table in (("short", samples_to_table(make_samples(args.rows, 2, 80))),
                         ("long", samples_to_table(make_samples(long_rows, 30, 660)))):  # fmt: skip
        a, b = per_row(table), table_to_samples(table)
        assert [s.model_dump_json() for s in a] == [s.model_dump_json() for s in b], "the two ways disagree"
        figures[f"{label}_per_row_us"] = best_us_a_row(per_row, table, args.reps)
        figures[f"{label}_columns_us"] = best_us_a_row(table_to_samples, table, args.reps)
        print(f"{label}: {table.num_rows} rows, {len(table.column('tokens').chunk(0).values) // table.num_rows} "
              f"tokens a row: per row {figures[f'{label}_per_row_us']:.1f} us, column-wise "
              f"{figures[f'{label}_columns_us']:.1f} us a row")  # fmt: skip
    speedup = figures["short_per_row_us"] / figures["short_columns_us"]
    print("bench_samples_read: " + " ".join(f"{k}={v:.1f}" for k, v in figures.items()) + f" speedup_short={speedup:.1f}")


if __name__ == "__main__":
    main()
