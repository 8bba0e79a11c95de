"""Benchmark the trajectory core (not a test).

1. A 200-turn session (``--turns``) of ~5K tokens per turn (~1M tokens): record every turn in a
   TurnTree (append-only) and linearize it into Samples. Timed side by side with the
   slime-style baseline that aligns each turn by comparing the turn's full prompt
   token list against the accumulated sequence (plain Python lists), then copies
   the accumulated ids / loss mask / logprobs forward.
2. 100 vs 400 turns (half and twice the session; same tokens per turn) for linear scaling.
3. Shard write throughput on real files (write + checksum + fsync + rename
   + manifest fsync) and read throughput, touching every token: unverified, verified
   with the default xxh3_128 (every read path verifies by default), and with sha256.

Every number is the best of several repetitions (the machine is shared: the best run
is the one least disturbed; medians are printed alongside).

Allocator note: each 400-turn linearization allocates ~18 MB of fresh arrays (tokens,
loss mask, logprobs). With glibc's default heuristics the freed block exceeds the
dynamic trim threshold, so every call returns the memory to the kernel and page-faults
it back (~1-5 us per 4 KiB page on this VM), while a 100-turn call (4.5 MB) stays
under it and reuses warm memory: the 400/100 ratio then measures the allocator, not
the algorithm. The timings are therefore taken twice: first with glibc defaults
(printed), then after ``mallopt`` raises the mmap/trim thresholds so both sizes reuse
memory alike (what a long-running reducer with ``MALLOC_TRIM_THRESHOLD_`` set sees).
The final line reports the second set. Last line:
bench_trajectory: linearize_1M_ms=<float> speedup_vs_prefix_compare=<float> scaling_400_over_100=<float>
shard_write_MBps=<float> read_MBps=<float> read_verified_MBps=<float> verify_overhead_pct=<float>
verify_overhead_warm_pct=<float> (read_*, verify_overhead_pct: from disk; _warm: from the page cache)
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from farm.trajectory import SAMPLE_SCHEMA, RolloutInfo, TurnTree, linearize, samples_to_table
from farm.output import ShardReader, ShardWriter
from farm.output.integrity import checksum
from farm.output.manifest import encode

FIRST_PROMPT, DELTA, OUTPUT = 4000, 1000, 4000  # ~5K new tokens per turn


def session_inputs(turns: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(turns):
        delta = rng.integers(0, 150_000, FIRST_PROMPT + DELTA if i == 0 else DELTA, dtype=np.int32)
        output = rng.integers(0, 150_000, OUTPUT, dtype=np.int32)
        logprobs = -rng.random(OUTPUT, dtype=np.float32)
        out.append((delta, output, logprobs))
    return out


def farm_record_and_linearize(inputs) -> tuple[float, int]:
    t0 = time.perf_counter()
    tree = TurnTree("bench")
    parent = None
    for delta, output, logprobs in inputs:
        parent = tree.append(parent_id=parent, prompt_delta_ids=delta, output_ids=output,
                             output_logprobs=logprobs, finish_reason="stop").turn_id  # fmt: skip
    samples = linearize(tree, RolloutInfo(rollout_id="bench", reward=1.0))
    dt = time.perf_counter() - t0
    return dt, len(samples[0].tokens)


def baseline_prefix_compare(inputs_as_lists) -> tuple[float, int]:
    """slime-style: each turn brings its full prompt ids; align against the accumulated
    sequence by comparing token lists, then carry tokens / mask / logprobs forward."""
    acc: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    prompt_length = 0
    timed = 0.0
    for i, (delta, output, lps) in enumerate(inputs_as_lists):
        prompt = acc + delta  # the turn's full prompt as re-tokenised (not timed)
        t0 = time.perf_counter()
        n = len(acc)
        if prompt[:n] != acc:  # mismatch: find where (never taken here: no drift)
            k = next(j for j, (a, b) in enumerate(zip(prompt, acc)) if a != b)
            prompt = acc[:k] + prompt[k:]
        if i == 0:
            prompt_length = len(prompt)
        new_prompt = prompt[n:]
        acc = prompt + output  # the next turn is aligned against prompt + output
        if i:
            mask.extend([0] * len(new_prompt))  # mask/logprobs grow in place (amortised O(new))
            logprobs.extend([0.0] * len(new_prompt))
        mask.extend([1] * len(output))
        logprobs.extend(lps)
        timed += time.perf_counter() - t0
    assert len(acc) - prompt_length == len(mask) == len(logprobs)
    return timed, len(acc)


def timed_ms(fn, reps: int) -> tuple[float, float]:
    """(best, median) wall time in ms over ``reps`` runs."""
    times = []
    for _ in range(reps):
        gc.collect()
        times.append(fn()[0] * 1e3)
    return min(times), statistics.median(times)


def evict(out: Path) -> None:
    """Drop the shards' (clean, fsynced) pages from the page cache: the next read comes
    from the disk, as a trainer's first read of a shard written elsewhere does."""
    for path in out.rglob("*.arrow"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _touch(column) -> int:
    """Read every value of a list column (what a trainer does with tokens / mask / logprobs)."""
    return sum(int(np.asarray(c.values.to_numpy()).sum(dtype=np.float64) != 0.5) for c in column.chunks)


def bench_shards(tmp: Path, inputs, reps: int) -> dict[str, float]:
    """Write throughput, and read throughput three ways on the same shards: no checksum,
    the default xxh3_128 verification, and sha256 (older manifests), through an
    alternative manifest naming the same shards; each from the disk (pages evicted
    first) and from the page cache. A read touches every value of the tokens, loss mask
    and logprobs, as a trainer does (a memory-mapped read that touches nothing costs
    nothing)."""
    tree = TurnTree("bench")
    parent = None
    for delta, output, logprobs in inputs:
        parent = tree.append(parent_id=parent, prompt_delta_ids=delta, output_ids=output,
                             output_logprobs=logprobs, finish_reason="stop").turn_id  # fmt: skip
    table = samples_to_table(linearize(tree, RolloutInfo(rollout_id="x", reward=1.0)))
    per_rollout = 8
    writes: list[float] = []
    reads: dict[str, list[float]] = {f"{c}_{k}": [] for c in ("cold", "warm") for k in ("plain", "xxh3_128", "sha256")}
    nbytes = shards = 0
    for rep in range(reps):
        out = tmp / f"shards{rep}"
        w = ShardWriter(out, SAMPLE_SCHEMA, max_rows=per_rollout * 2)  # two rollouts per shard
        t0 = time.perf_counter()
        for i in range(per_rollout):
            w.write_rollout(f"r{i}", table)
        w.close()
        dt = time.perf_counter() - t0
        nbytes, shards = sum(e.bytes for e in w.entries), len(w.entries)
        writes.append(nbytes / dt / 1e6)
        legacy = [e.model_copy(update={"checksum": checksum((out / e.shard).read_bytes(), "sha256")})
                  for e in w.entries]  # fmt: skip
        (out / "sha256.manifest.jsonl").write_bytes(b"".join(encode(e) for e in legacy))
        for cache in ("cold", "warm"):
            for kind, manifest in (("plain", None), ("xxh3_128", None), ("sha256", "sha256.manifest.jsonl")):
                if cache == "cold":
                    evict(out)
                reader = ShardReader(out, verify=kind != "plain", manifest_name=manifest)
                t0 = time.perf_counter()
                got = reader.read_table()
                touched = sum(_touch(got.column(c)) for c in ("tokens", "loss_mask", "rollout_logprobs"))
                reads[f"{cache}_{kind}"].append(nbytes / (time.perf_counter() - t0) / 1e6)
                assert got.num_rows == per_rollout and touched >= 0
    out_figures = {"write": max(writes), "write_med": statistics.median(writes), "bytes": nbytes, "shards": shards}
    out_figures.update({k: max(v) for k, v in reads.items()})
    return out_figures


def steady_allocator() -> bool:
    """Raise glibc's mmap/trim thresholds (see the module doc). False if not glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def measure(args) -> dict[str, float]:
    inputs = session_inputs(args.turns)
    farm_record_and_linearize(inputs)  # warm-up
    small, large = session_inputs(args.turns // 2, seed=1), session_inputs(args.turns * 2, seed=2)
    farm_record_and_linearize(small)
    farm_record_and_linearize(large)
    r: dict[str, float] = {}
    r["farm"], r["farm_med"] = timed_ms(lambda: farm_record_and_linearize(inputs), args.reps)
    r["t100"], r["m100"] = timed_ms(lambda: farm_record_and_linearize(small), args.reps)
    r["t400"], r["m400"] = timed_ms(lambda: farm_record_and_linearize(large), args.reps)
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--baseline-reps", type=int, default=3)
    ap.add_argument("--shard-reps", type=int, default=5)
    ap.add_argument("--turns", type=int, default=200, help="turns of the session (x 5K tokens); scaling: half vs twice")
    ap.add_argument("--quick", action="store_true",
                    help="the smallest size, which the test suite runs: its figures mean nothing")
    args = ap.parse_args()
    if args.quick:
        args.turns, args.reps, args.baseline_reps, args.shard_reps = 8, 1, 1, 1

    inputs = session_inputs(args.turns)
    _, n_tokens = farm_record_and_linearize(inputs)
    default = measure(args)
    tuned_ok = steady_allocator()
    r = measure(args)
    as_lists = [(d.tolist(), o.tolist(), lp.tolist()) for d, o, lp in inputs]
    base_ms, base_med = timed_ms(lambda: baseline_prefix_compare(as_lists), args.baseline_reps)
    del as_lists
    print(f"session: {args.turns} turns, {n_tokens} tokens; times best / median of {args.reps}")
    print(f"  glibc default allocator: record+linearize {default['farm']:.2f} / {default['farm_med']:.2f} ms; "
          f"{args.turns // 2} turns {default['t100']:.2f} ms, {args.turns * 2} turns {default['t400']:.2f} ms "
          f"(x{default['t400'] / default['t100']:.2f})")  # fmt: skip
    label = "steady allocator (mallopt)" if tuned_ok else "allocator unchanged (mallopt unavailable)"
    print(f"  {label}: record+linearize {r['farm']:.2f} / {r['farm_med']:.2f} ms; "
          f"{args.turns // 2} turns {r['t100']:.2f} / {r['m100']:.2f} ms, "
          f"{args.turns * 2} turns {r['t400']:.2f} / {r['m400']:.2f} ms "
          f"(x{r['t400'] / r['t100']:.2f}, linear = 4)")  # fmt: skip
    print(f"  baseline prefix-compare alignment (plain lists): {base_ms:.2f} / {base_med:.2f} ms "
          f"(x{base_ms / r['farm']:.1f} slower)")  # fmt: skip
    farm_ms, t100, t400 = r["farm"], r["t100"], r["t400"]

    with tempfile.TemporaryDirectory(prefix="bench_trajectory_") as tmp:
        sh = bench_shards(Path(tmp), inputs, args.shard_reps)
    cold = (sh["cold_plain"] / sh["cold_xxh3_128"] - 1) * 100  # extra read time with the default verification
    warm = (sh["warm_plain"] / sh["warm_xxh3_128"] - 1) * 100
    print(f"shards: {sh['bytes'] / 1e6:.0f} MB per run in {sh['shards']} shard(s); write {sh['write']:.0f} MB/s "
          f"(median {sh['write_med']:.0f}; one record batch written to the file, xxh3_128 beside; fsync + rename "
          "+ manifest)")  # fmt: skip
    for cache, label in (("cold", "from disk (pages evicted)"), ("warm", "from the page cache")):
        base = sh[f"{cache}_plain"]
        print(f"  read {label}, every token/mask/logprob touched: {base:.0f} MB/s unverified; "
              f"{sh[f'{cache}_xxh3_128']:.0f} MB/s verified xxh3_128 (default, "
              f"+{(base / sh[f'{cache}_xxh3_128'] - 1) * 100:.1f}% time); {sh[f'{cache}_sha256']:.0f} MB/s "
              f"verified sha256 (+{(base / sh[f'{cache}_sha256'] - 1) * 100:.1f}%)")  # fmt: skip
    print(
        f"bench_trajectory: linearize_1M_ms={farm_ms:.2f} speedup_vs_prefix_compare={base_ms / farm_ms:.1f} "
        f"scaling_400_over_100={t400 / t100:.2f} shard_write_MBps={sh['write']:.1f} "
        f"read_MBps={sh['cold_plain']:.0f} read_verified_MBps={sh['cold_xxh3_128']:.0f} verify_overhead_pct={cold:.1f} "
        f"verify_overhead_warm_pct={warm:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
