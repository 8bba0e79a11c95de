#!/usr/bin/env python
"""MoE routing replay benchmark (not a test).

One Claude Code–style session (the 24 tools of the capture, ``bench_gateway``'s
``first_body`` / ``bash_reply`` / ``tool_output`` / ``echo``) of 64 turns growing to
128K tokens (each tool output is sized so the 64th turn's sequence lands on
``--target-tokens``), driven over HTTP through the real gateway, the real
``EngineClient`` and a real in-process scripted SGLang worker (aiohttp) that simulates
a MoE of 48 layers, 128 experts, top-8 (``WorkerSettings.moe``; SGLang's wire format:
base64 int32 ``[rows, layers, top_k]``). The same session runs three times:

* ``off``: routing replay off (``EngineClientConfig.routed_experts=None``): the
  baselines for the per-turn time and the shard size;
* ``incremental``: ``EngineClientConfig(routed_experts=shape)``, the gateway's real
  behaviour (an appended turn asks with ``routed_experts_start_len`` = its parent's
  sequence length - 1, the root asks from 0);
* ``full``: full re-fetch. The benchmark (only the benchmark) replaces this gateway's
  ``TurnService._routed_start`` on its instance by a wrapper that returns 0 on the
  turns measured for the full re-fetch: turn 1 and every ``--full-every``-th turn (8,
  16, ..., 64 by default); the other turns keep the real incremental start so the
  session and its Sample stay the same. A full re-fetch at 128K x 48 x 8 int32 is
  ~262 MB of base64 per turn (several seconds of fake-MoE work in the worker plus the
  decode in the gateway), so every turn of it would take minutes.

Measured vs computed:

* bytes moved from the engine per turn = the routed-experts payload of the reply as
  it came over the wire (base64 characters, the gateway's ``meta["routed_bytes"]``).
  ``incremental``: measured on every turn. ``full``: measured on the turns above;
  for the others it is computed with the formula the engine uses,
  ``4 * ceil(4 * (seq_len - 1) * layers * top_k / 3)`` (base64 of int32 rows for
  positions ``[0, seq_len - 1)``); the formula is checked against every measured
  payload of both runs (``formula_mismatches=0``). ``transfer_ratio`` = total
  incremental bytes / total full re-fetch bytes over the 64 turns.
* ``bytes_per_token``: bytes of the ``routed_experts`` column per routed position of
  the Sample (``layers * top_k * 1`` byte with <= 256 experts); ``shard_bytes_per_token``:
  (Arrow shard with routing - the same run's shard without) / the Sample's tokens.
* ``shard_overhead`` = (shard with routing - shard of the ``off`` run) / shard of the
  ``off`` run (the real Sample writer, ``open_sample_writer``, Arrow IPC, no compression).
* gateway per-turn time: the gateway (its aiohttp server, turn service and engine
  client) runs on its own thread and event loop, the worker on another, the driving
  client on the main thread; a turn's figure is the CPU time the gateway thread used
  between the client sending the request and receiving the end of the stream
  (``pthread_getcpuclockid``; gc collected before and paused during each turn). So it
  excludes the fake MoE's work in the worker and the client's work. The figure is the
  median over the appended turns (2..64) of the per-turn difference with routing minus
  the same turn without (the sessions are identical token by token, checked);
  wall-clock medians are printed too (they include the in-process worker).
* ``aligned=1``: every Sample of both routing runs, read back from its shard, has
  ``routed_experts`` equal to ``fake_routing(sample.tokens, 0, n - 1, shape)`` at every
  position and no unknown span.

Side table vs column (the layout decision): the ``incremental`` run's Samples written
(a) with routing in the ``routed_experts`` column of the Samples table, (b) with that
column null + a side table ``routing`` of (rollout_id, chain_index, routed_experts),
each as Arrow IPC and as Parquet. A reader that does NOT need routing reads the
training columns (``NEEDED``) and touches every byte it got: with farm's
``open_sample_reader`` (checksums verified, as by default) and with a projecting
``read_table(columns=NEEDED)`` (``pyarrow.feather`` memory-mapped / ``pyarrow.parquet``);
warm page cache and cold (``posix_fadvise(DONTNEED)`` on the shard files first); median
of ``--reads`` reads.

Last line: ``bench_routing: turns=64 transfer_ratio=... bytes_per_token=...
shard_overhead=... turn_ms_overhead=... aligned=1 final_tokens=... bytes_per_turn_incremental=...
bytes_per_turn_full=... full_measured_turns=... formula_mismatches=... shard_bytes_per_token=...
turn_ms=... turn_ms_routed=... side_table_size_ratio=... read_ms_column=... read_ms_side=...
read_ms_column_cold=... read_ms_side_cold=...``.
``--quick``: the smallest size, which the test suite runs
(``tests/scripts/test_scripts_benches.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import math
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench_gateway import ROOT, bash_reply, echo, first_body, tool_output

NEEDED = ["rollout_id", "chain_index", "tokens", "prompt_length", "response_length", "loss_mask",
          "rollout_logprobs", "reward"]  # what a trainer that does not replay routing reads
TOKENS_PER_LINE = 24.2  # of tool_output's lines with the builtin tokenizer (only sizes the session)
CHECK_CHUNK = 16_384


# ---- an event loop on its own thread ---------------------------------------------
class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def enter(self, cm: Any) -> Any:
        return self.call(self.stack.enter_async_context(cm))

    def cpu_clock(self) -> int:
        async def clock() -> int:
            return time.pthread_getcpuclockid(threading.get_ident())

        return self.call(clock())

    def close(self) -> None:
        try:
            self.call(self.stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


# ---- one session through the gateway ------------------------------------------------
@dataclass
class Run:
    name: str
    seq: list[int] = field(default_factory=list)  # sequence length after each turn
    cpu_ms: list[float] = field(default_factory=list)  # gateway thread CPU per turn
    wall_ms: list[float] = field(default_factory=list)
    full_turns: set[int] = field(default_factory=set)  # 1-based turns asked from 0 (full variant)
    tree: Any = None
    stats: Any = None


def b64_len(raw: int) -> int:
    return 4 * math.ceil(raw / 3)


def full_bytes(seq_len: int, shape: Any) -> int:
    """The engine's payload for positions [0, seq_len - 1): base64 of int32 rows."""
    return b64_len(4 * (seq_len - 1) * shape.per_token)


async def drive(url: str, secret: str, clock: int, turns: int, target: int, before_turn: Callable[[int], None],
                run: Run) -> None:
    import aiohttp
    import orjson

    sys.path.insert(0, str(ROOT / "tests" / "gateway"))
    from gateway_helpers import check_anthropic_stream

    from farm.modeltext.toolcalls import ToolCall

    body = first_body()
    rng = random.Random(0)
    headers = {"x-api-key": secret, "Content-Type": "application/json"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as http:
        for i in range(1, turns + 1):
            data = orjson.dumps(body)
            before_turn(i)
            gc.collect()
            gc.disable()
            c0, w0 = time.clock_gettime(clock), time.perf_counter()
            async with http.post(url + "/v1/messages?beta=true", data=data, headers=headers) as resp:
                text = await resp.text()
                status = resp.status
            w1, c1 = time.perf_counter(), time.clock_gettime(clock)
            gc.enable()
            if status != 200 or "event: error" in text:
                raise RuntimeError(f"{run.name} turn {i}: HTTP {status}: {text[:500]}")
            msg = check_anthropic_stream(text)
            run.cpu_ms.append((c1 - c0) * 1e3)
            run.wall_ms.append((w1 - w0) * 1e3)
            seq = msg["usage"]["input_tokens"] + msg["usage"]["output_tokens"]
            run.seq.append(seq)
            if i == turns:
                break
            uses = [b for b in msg["content"] if b["type"] == "tool_use"]
            if msg["stop_reason"] != "tool_use" or len(uses) != 1:
                raise RuntimeError(f"{run.name} turn {i}: expected one tool_use, got {msg['content']}")
            calls = [ToolCall(u["id"], u["name"], u["input"]) for u in uses]
            said = "".join(b["text"] for b in msg["content"] if b["type"] == "text")
            # size the tool output so the last turn's sequence lands on the target
            grow = (target - seq) / (turns - i) - (msg["usage"]["output_tokens"] + 40)
            lines = max(1, round(grow / TOKENS_PER_LINE))
            echo(body, said, calls, [tool_output(rng, lines)])


def session_run(name: str, tok: Any, shape: Any, args: argparse.Namespace) -> Run:
    """One session over a fresh worker + engine client + gateway (each loop on its own thread)."""
    from farm.engine.client import EngineClient
    from farm.engine.config import EngineClientConfig
    from farm.simulator import ScriptedPolicy, ScriptedWorker, WorkerSettings, serve_worker
    from farm.gateway.config import GatewayConfig
    from farm.gateway.gateway import Gateway
    from farm.modeltext.toolcalls import get_format

    fmt = get_format("hermes")
    run = Run(name)
    policy = ScriptedPolicy()
    sid = f"bench-{name}"
    policy.push(*[bash_reply(fmt, n) for n in range(1, args.turns)], "The failing test passes now.",
                routing_key=sid)  # fmt: skip
    worker_t, gw_t = LoopThread("bench-worker"), LoopThread("bench-gateway")
    try:
        async def make_worker() -> Any:
            return ScriptedWorker(tok, policy, WorkerSettings(moe=shape))

        worker = worker_t.call(make_worker())
        url = worker_t.enter(serve_worker(worker))
        client = EngineClientConfig(routed_experts=None if name == "off" else shape)
        cfg = GatewayConfig(engine_client=client)
        engine = gw_t.enter(EngineClient(url, cfg.engine_client, seed=0))
        gw = gw_t.enter(Gateway(cfg, tok, engine, fmt))
        secret = gw.open_session(sid).secret
        full_now = [False]
        if name == "full":  # the benchmark's override: ask from 0 on the measured turns
            real = gw.service._routed_start

            def routed_start(pending: Any) -> int | None:
                start = real(pending)
                return 0 if start is not None and full_now[0] else start

            gw.service._routed_start = routed_start

        def before_turn(i: int) -> None:
            full_now[0] = name == "full" and (i == 1 or i % args.full_every == 0)
            if full_now[0]:
                run.full_turns.add(i)

        asyncio.run(drive(gw.base_url, secret, gw_t.cpu_clock(), args.turns, args.target_tokens, before_turn, run))
        run.tree = gw_t.call(gw.close_session(sid))
        run.stats = gw.stats(sid)
    finally:
        gw_t.close()
        worker_t.close()
    return run


# ---- Samples: alignment and shards ------------------------------------------------------
def aligned(sample: Any, shape: Any) -> bool:
    from farm.engine.routing import fake_routing

    n = len(sample.tokens)
    re = sample.routed_experts
    if re is None or re.shape != (n - 1, shape.layers, shape.top_k):
        return False
    if sample.metadata.get("routed_experts", {}).get("unknown_spans") != []:
        return False
    toks = sample.tokens.astype(np.int64)
    for a in range(0, n - 1, CHECK_CHUNK):
        b = min(a + CHECK_CHUNK, n - 1)
        if not np.array_equal(re[a:b].astype(np.int32), fake_routing(toks, a, b, shape)):
            return False
    return True


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file() and not p.name.startswith("."))


def write_samples(directory: Path, table: Any, rollout_id: str, fmt: str) -> int:
    from farm.output.config import OutputConfig
    from farm.output.reader import open_sample_writer

    with open_sample_writer(OutputConfig(dir=str(directory), format=fmt)) as w:
        w.write_rollout(rollout_id, table)
    return dir_bytes(directory / "samples")


ROUTING_TABLE = "routing"


def routing_schema() -> Any:
    import pyarrow as pa

    return pa.schema([pa.field("rollout_id", pa.string(), nullable=False),
                      pa.field("chain_index", pa.int32(), nullable=False),
                      pa.field("routed_experts", pa.large_binary(), nullable=True)],
                     metadata={b"farm.table": b"routing"})  # fmt: skip


def write_side(directory: Path, table: Any, rollout_id: str, fmt: str) -> tuple[int, int]:
    """The Samples with a null routed_experts column + the side table; their sizes."""
    import pyarrow as pa

    from farm.output.shards import ShardWriter

    idx = table.schema.get_field_index("routed_experts")
    samples = table.set_column(idx, table.schema.field(idx), pa.nulls(table.num_rows, pa.large_binary()))
    side = pa.Table.from_arrays([table.column("rollout_id"), table.column("chain_index"),
                                 table.column("routed_experts")], schema=routing_schema())  # fmt: skip
    s = write_samples(directory, samples, rollout_id, fmt)
    with ShardWriter(directory, routing_schema(), name=ROUTING_TABLE, format=fmt) as w:
        w.write_rollout(rollout_id, side)
    return s, dir_bytes(directory / ROUTING_TABLE)


def touch(table: Any) -> int:
    """Read every byte of every buffer the reader handed out (pages in a mapped file)."""
    total = 0
    for col in table.columns:
        for chunk in col.chunks:
            for buf in chunk.buffers():
                if buf is not None and buf.size:
                    total += int(np.frombuffer(buf, dtype=np.uint8)[::64].sum())
    return total


def drop_cache(directory: Path) -> None:
    for p in directory.rglob("*"):
        if p.is_file() and p.suffix in (".arrow", ".parquet"):
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_farm(directory: Path, fmt: str) -> Any:
    from farm.output.reader import open_sample_reader

    return open_sample_reader(directory).read_table().select(NEEDED)


def read_projected(directory: Path, fmt: str) -> Any:
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    from farm.output.shard_reader import committed_files

    files = committed_files(directory, verify=False)
    if fmt == "arrow":
        tables = [feather.read_table(f, columns=NEEDED, memory_map=True) for f in files]
    else:
        tables = [pq.read_table(f, columns=NEEDED) for f in files]
    return pa.concat_tables(tables)


def time_reads(directory: Path, fmt: str, reader: Callable[[Path, str], Any], cold: bool, reps: int,
               expect_rows: int) -> float:
    times = []
    for _ in range(reps):
        if cold:
            drop_cache(directory)
        t0 = time.perf_counter()
        table = reader(directory, fmt)
        touch(table)
        times.append((time.perf_counter() - t0) * 1e3)
        assert table.num_rows == expect_rows and table.column_names == NEEDED
        del table
    return statistics.median(times)


# ---- main -------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--target-tokens", type=int, default=128_000, help="sequence length of the last turn")
    parser.add_argument("--full-every", type=int, default=8,
                        help="full re-fetch measured on turn 1 and every N-th turn (1: every turn)")
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--reads", type=int, default=5, help="reads per layout/reader/cache state (median)")
    parser.add_argument("--tokenizer", default="builtin:farm-test")
    parser.add_argument("--cache-dir", default=None, help="where builtin tokenizers are built")
    parser.add_argument("--quick", action="store_true",
                        help="the smallest size, which the test suite runs: its figures mean nothing")
    args = parser.parse_args()
    if args.quick:  # a few turns of a small MoE; the last turn full re-fetched
        args.turns, args.target_tokens, args.full_every, args.reads = 4, 6_000, 2, 1
        args.layers, args.top_k, args.experts = 4, 2, 16
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_start = time.perf_counter()

    from farm.engine.routing import MoEShape
    from farm.modeltext.tokenizer import load_tokenizer
    from farm.trajectory.linearize import RolloutInfo, linearize
    from farm.output.reader import open_sample_reader
    from farm.trajectory.schema import samples_to_table, table_to_samples

    shape = MoEShape(layers=args.layers, top_k=args.top_k, experts=args.experts)
    tok = load_tokenizer(args.tokenizer, args.cache_dir)
    runs: dict[str, Run] = {}
    for name in ("off", "incremental", "full"):
        t0 = time.perf_counter()
        runs[name] = session_run(name, tok, shape, args)
        st = runs[name].stats
        assert len(runs[name].tree.turns) == args.turns, (name, len(runs[name].tree.turns))
        assert st.appended == args.turns - 1 and st.full_renders == 0, (name, st)
        print(f"run {name}: {args.turns} turns, last sequence {runs[name].seq[-1]} tokens, "
              f"{time.perf_counter() - t0:.1f}s", flush=True)
    off, inc, full = runs["off"], runs["incremental"], runs["full"]
    assert off.seq == inc.seq == full.seq, "the three sessions differ"
    for name, run in runs.items():  # the tree agrees with what the client saw
        assert [t.sequence_length for t in run.tree.turns] == run.seq, name

    # ---- bytes moved per turn
    mismatches = 0
    inc_bytes, full_bytes_all, full_measured = [], [], []
    for i, (ti, tf) in enumerate(zip(inc.tree.turns, full.tree.turns), start=1):
        got = ti.meta.get("routed_bytes", 0)
        want = b64_len(4 * (ti.sequence_length - 1 - ti.routed_start) * shape.per_token)
        expect_start = 0 if i == 1 else inc.tree.turns[i - 2].sequence_length - 1
        mismatches += (got != want) + (ti.routed_start != expect_start)
        inc_bytes.append(got)
        if i in full.full_turns:
            assert tf.routed_start == 0
            measured = tf.meta.get("routed_bytes", 0)
            mismatches += measured != full_bytes(tf.sequence_length, shape)
            full_measured.append(measured)
            full_bytes_all.append(measured)
        else:
            full_bytes_all.append(full_bytes(tf.sequence_length, shape))
    transfer_ratio = sum(inc_bytes) / sum(full_bytes_all)
    assert not any(t.meta.get("routed_bytes") for t in off.tree.turns)

    # ---- per-turn gateway time (appended turns 2..N, paired with the same turn without routing)
    span = range(1, args.turns)
    d_inc = [inc.cpu_ms[i] - off.cpu_ms[i] for i in span]
    turn_ms_off = statistics.median(off.cpu_ms[i] for i in span)
    turn_ms_inc = statistics.median(inc.cpu_ms[i] for i in span)
    turn_ms_overhead = statistics.median(d_inc)
    full_idx = sorted(i - 1 for i in full.full_turns if i > 1)
    d_full = [full.cpu_ms[i] - off.cpu_ms[i] for i in full_idx]
    wall_off = statistics.median(off.wall_ms[i] for i in span)
    wall_inc = statistics.median(inc.wall_ms[i] for i in span)

    print(f"\nsession: {args.turns} turns, sequence {off.seq[0]} -> {off.seq[-1]} tokens; fake MoE "
          f"layers={shape.layers} top_k={shape.top_k} experts={shape.experts} ({shape.dtype} stored)")
    print(f"{'turn':>5} {'seq':>7} {'incr_MB':>8} {'full_MB':>8} {'full':>9} {'cpu_off':>8} {'cpu_incr':>9} "
          f"{'cpu_full':>9}  (gateway thread CPU ms; full: bytes measured or computed; cpu_full is the full "
          "run's turn, a full re-fetch only where measured)")
    for i in sorted(full.full_turns | {args.turns}):
        k = i - 1
        how = "measured" if i in full.full_turns else "computed"
        print(f"{i:>5} {off.seq[k]:>7} {inc_bytes[k] / 1e6:>8.2f} {full_bytes_all[k] / 1e6:>8.2f} {how:>9} "
              f"{off.cpu_ms[k]:>8.2f} {inc.cpu_ms[k]:>9.2f} {full.cpu_ms[k]:>9.2f}")
    print(f"bytes per turn (mean over {args.turns}): incremental={statistics.mean(inc_bytes) / 1e6:.2f} MB "
          f"(measured every turn), full re-fetch={statistics.mean(full_bytes_all) / 1e6:.2f} MB "
          f"(measured on {len(full_measured)} turns {sorted(full.full_turns)}, computed on the other "
          f"{args.turns - len(full_measured)}); totals {sum(inc_bytes) / 1e6:.1f} MB vs "
          f"{sum(full_bytes_all) / 1e6:.1f} MB; formula mismatches={mismatches}")
    print(f"gateway CPU per appended turn (median, turns 2..{args.turns}): off={turn_ms_off:.2f} ms, "
          f"incremental={turn_ms_inc:.2f} ms, paired overhead={turn_ms_overhead:.2f} ms "
          f"(max {max(d_inc):.2f}); full re-fetch on its measured turns: median overhead "
          f"{statistics.median(d_full) if d_full else float('nan'):.1f} ms, at the last turn "
          f"{full.cpu_ms[-1] - off.cpu_ms[-1]:.1f} ms; wall per turn incl. the in-process worker: "
          f"off={wall_off:.1f} ms incremental={wall_inc:.1f} ms", flush=True)

    # ---- Samples, shards, alignment, layouts
    infos = {name: RolloutInfo(rollout_id=f"rollout-{name}", run_id="bench-routing", task_id="calc",
                               group_id="g0", harness="claude", model="m", reward=1.0)
             for name in runs}  # fmt: skip
    samples = {name: linearize(run.tree, infos[name]) for name, run in runs.items()}
    for run in runs.values():
        run.tree = None
    for name in runs:
        assert len(samples[name]) == len(samples["off"]) >= 1
        for a, b in zip(samples[name], samples["off"]):
            assert np.array_equal(a.tokens, b.tokens), name
    assert all(s.routed_experts is None for s in samples["off"])
    n_tokens = sum(len(s.tokens) for s in samples["incremental"])
    routed_positions = sum(len(s.routed_experts) for s in samples["incremental"])
    routed_bytes_stored = sum(s.routed_experts.nbytes for s in samples["incremental"])
    bytes_per_token = routed_bytes_stored / routed_positions

    ok = True
    read_rows: dict[str, tuple[float, ...]] = {}
    with tempfile.TemporaryDirectory(prefix="farm-bench-routing-") as tmp:
        base = Path(tmp)
        sizes: dict[tuple[str, str], int] = {}
        for name in runs:
            table = samples_to_table(samples[name])
            sizes[(name, "arrow")] = write_samples(base / f"{name}-arrow", table, infos[name].rollout_id, "arrow")
            if name != "off":  # every Sample read back from its shard, checked token by token
                back = table_to_samples(open_sample_reader(base / f"{name}-arrow").read_table())
                ok = ok and len(back) == len(samples[name]) and all(aligned(s, shape) for s in back)
                del back
            del table
        samples["full"] = samples["off"] = []
        table = samples_to_table(samples["incremental"])
        rid = infos["incremental"].rollout_id
        layout: dict[tuple[str, str], tuple[int, int]] = {}
        for fmt in ("arrow", "parquet"):
            layout[("column", fmt)] = (write_samples(base / f"column-{fmt}", table, rid, fmt), 0)
            layout[("side", fmt)] = write_side(base / f"side-{fmt}", table, rid, fmt)
        del table
        rows = len(samples["incremental"])
        readers = {"farm": read_farm, "projected": read_projected}
        for fmt in ("arrow", "parquet"):
            for rname, reader in readers.items():
                for cold in (False, True):
                    ms = tuple(time_reads(base / f"{lay}-{fmt}", fmt, reader, cold, args.reads, rows)
                               for lay in ("column", "side"))  # fmt: skip
                    read_rows[f"{fmt} {rname} {'cold' if cold else 'warm'}"] = ms
    shard_off, shard_on = sizes[("off", "arrow")], sizes[("incremental", "arrow")]
    shard_overhead = (shard_on - shard_off) / shard_off
    shard_bpt = (shard_on - shard_off) / n_tokens

    print(f"\nshard (Arrow IPC, one Sample of {n_tokens} tokens): off={shard_off / 1e6:.2f} MB "
          f"incremental={shard_on / 1e6:.2f} MB full={sizes[('full', 'arrow')] / 1e6:.2f} MB; routing "
          f"{bytes_per_token:.2f} B per routed position (column bytes), {shard_bpt:.2f} B per token "
          f"(shard difference); overhead={shard_overhead:.3f} (+{shard_overhead * 100:.0f}%)")
    print("layout: routed experts as a Samples column vs a side table (rollout_id, chain_index, routed_experts)")
    for fmt in ("arrow", "parquet"):
        col, _ = layout[("column", fmt)]
        s, r = layout[("side", fmt)]
        print(f"  {fmt:<8} column: samples={col / 1e6:.3f} MB | side: samples={s / 1e6:.3f} MB + "
              f"routing={r / 1e6:.3f} MB = {(s + r) / 1e6:.3f} MB ({(s + r) / col:.4f}x)")
    print(f"  a reader that does not need routing reads {NEEDED} (median ms of {args.reads}):")
    print(f"  {'format reader cache':<26} {'column':>9} {'side':>9} {'column/side':>12}")
    for key, (c, s) in read_rows.items():
        print(f"  {key:<26} {c:>9.2f} {s:>9.2f} {c / s:>12.1f}")
    col_a = layout[("column", "arrow")][0]
    side_a = sum(layout[("side", "arrow")])
    farm_warm = read_rows["arrow farm warm"]
    farm_cold = read_rows["arrow farm cold"]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
    runtime = time.perf_counter() - t_start
    print(f"runtime {runtime:.0f}s, peak RSS {rss:.0f} MB")
    print(f"bench_routing: turns={args.turns} transfer_ratio={transfer_ratio:.4f} bytes_per_token={bytes_per_token:.2f} "
          f"shard_overhead={shard_overhead:.2f} turn_ms_overhead={turn_ms_overhead:.2f} aligned={int(ok)} "
          f"final_tokens={off.seq[-1]} bytes_per_turn_incremental={statistics.mean(inc_bytes):.0f} "
          f"bytes_per_turn_full={statistics.mean(full_bytes_all):.0f} full_measured_turns={len(full_measured)} "
          f"formula_mismatches={mismatches} shard_bytes_per_token={shard_bpt:.2f} turn_ms={turn_ms_off:.2f} "
          f"turn_ms_routed={turn_ms_inc:.2f} side_table_size_ratio={side_a / col_a:.4f} "
          f"read_ms_column={farm_warm[0]:.2f} read_ms_side={farm_warm[1]:.2f} "
          f"read_ms_column_cold={farm_cold[0]:.2f} read_ms_side_cold={farm_cold[1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
