"""``farm export RUN_DIR -o OUT_DIR [--format parquet] [--table samples|rollouts|all]``:
a copy of a run's committed rows as plain Parquet (or Arrow IPC) shards in the current
schema version, for readers that do not consult farm's manifest (HF ``datasets``, Ray
Data, polars, DuckDB): an Arrow-IPC run gets Parquet without running again.

What is read: only shards a manifest line commits, through ``ShardReader``: every one
is checked against its checksum before anything is written (a missing or damaged shard
ends the export with exit 1, naming it, and OUT_DIR untouched); each rollout once (the
first shard listing it wins, as ``follow_batches``); shards of an older schema version
upgraded on the fly (``migrate_table``, ``migrate_rollouts``).

What is written: OUT_DIR is itself a farm output directory, written by the run's own
``ShardWriter`` (temp name, fsync, rename, then the manifest line): ``OUT/samples/*.parquet``
+ ``manifest.jsonl``, ``OUT/rollouts/*.parquet`` + ``rollouts.manifest.jsonl``, and
``export.json`` (source, format, schema version, counts; ``complete`` once done). Its
writers are closed when the command returns, so a glob of ``OUT/samples/*.parquet`` is
exactly the committed set, one schema version, each rollout once. OUT_DIR must be new or
empty, or an earlier export of the same RUN_DIR in the same format: then only the
rollouts it lacks are added (an interrupted export resumes, a run that went on is
brought up to date). OUT_DIR equal to or inside RUN_DIR is refused (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

TABLES = ("samples", "rollouts")
MARKER = "export.json"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="the output directory of a run (output.dir)")
    parser.add_argument("-o", "--out", dest="out_dir", required=True, help="where to write the copy (new or empty)")
    parser.add_argument("--format", choices=["parquet", "arrow"], default="parquet", help="shard format (parquet)")
    parser.add_argument("--table", choices=[*TABLES, "all"], default="all", help="which table(s) to export (all)")
    parser.add_argument("--compression", choices=["zstd", "lz4"], default=None, help="shard compression (none)")
    parser.add_argument("--shard-rows", type=int, default=512, help="rows per written shard (512)")


def _refusal(run: Path, out: Path, fmt: str) -> str | None:
    """Why OUT_DIR may not be written, or None."""
    run_r, out_r = run.resolve(), out.resolve()
    if out_r == run_r or run_r in out_r.parents:
        return f"{out} is the run directory or inside it: export to a directory of its own"
    if out.exists() and not out.is_dir():
        return f"{out} exists and is not a directory"
    if out.is_dir() and any(out.iterdir()):
        try:
            prev = json.loads((out / MARKER).read_text())
        except (OSError, ValueError):
            prev = {}
        if prev.get("source") != str(run_r) or prev.get("format") != fmt:
            return f"{out} is not empty and not an earlier {fmt} export of {run_r}: choose a new directory"
    return None


def _by_rollout(table: Any, listed: list[str]) -> Iterator[tuple[str, Any]]:
    """(rollout id, its rows) per rollout of one shard, in its manifest line's order. A
    rollout without rows (an infrastructure failure has no Samples) is kept: its id
    stays committed in the copy, as in the run."""
    rows: dict[str, list[int]] = {rid: [] for rid in listed}
    for i, rid in enumerate(table.column("rollout_id").to_pylist()):
        rows.setdefault(rid, []).append(i)
    for rid, idx in rows.items():
        yield rid, table.take(idx) if idx else table.slice(0, 0)


def _write_marker(out: Path, data: dict[str, Any]) -> None:
    # heavy: numpy, pyarrow, pydantic
    from farm.output.manifest import fsync_dir, write_durable

    tmp = out / f".{MARKER}.tmp"
    tmp.unlink(missing_ok=True)
    write_durable(tmp, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())
    os.replace(tmp, out / MARKER)
    fsync_dir(out)


def export(run: Path, out: Path, *, tables: list[str], fmt: str, compression: str | None,
           shard_rows: int) -> dict[str, dict[str, int]]:
    """Copy ``tables`` of ``run`` into ``out`` (see the module doc); per table: shards,
    rows, rollouts in the copy, rollouts added now, duplicates dropped."""
    # heavy: numpy, pyarrow, pydantic
    from farm.output.reader import OutputReader
    from farm.trajectory.schema import SCHEMA_VERSION
    from farm.output.shards import ShardWriter

    # older shards come out in the current shape (OutputReader upgrades each table)
    source = OutputReader(run)
    readers = {name: source.table(name) for name in tables}
    for reader in readers.values():
        reader.files()  # every checksum first: a damaged run leaves OUT_DIR untouched
    out.mkdir(parents=True, exist_ok=True)
    try:  # an earlier export of this run (``_refusal`` checked): its other tables' counts stay
        earlier_tables = json.loads((out / MARKER).read_text()).get("tables", {})
    except (OSError, ValueError):
        earlier_tables = {}
    marker: dict[str, Any] = {"source": str(run.resolve()), "format": fmt, "schema_version": SCHEMA_VERSION,
                              "complete": False, "tables": earlier_tables}  # fmt: skip
    _write_marker(out, marker)
    counts: dict[str, dict[str, int]] = {}
    for name, reader in readers.items():
        with ShardWriter(out, reader.schema, name=name, format=fmt,  # type: ignore[arg-type]
                         compression=compression, max_rows=shard_rows) as writer:  # fmt: skip
            earlier = writer.durable_ids
            added = duplicates = 0
            for entry in reader.entries():
                for rid, rows in _by_rollout(reader.read_shard(entry), entry.rollout_ids):
                    if writer.write_rollout(rid, rows):  # False: this rollout is in the copy already
                        added += 1
                    elif rid not in earlier:
                        duplicates += 1
        counts[name] = {"shards": len(writer.entries), "rows": sum(e.rows for e in writer.entries),
                        "rollouts": writer.durable_count, "added": added,
                        "duplicates_dropped": duplicates}  # fmt: skip
    marker.update(complete=True, tables={**earlier_tables, **counts}, exported_at=time.time())
    _write_marker(out, marker)
    return counts


def run(args: argparse.Namespace) -> int:
    # the CLI's start-up: a command loads its code when it runs; heavy: numpy, pyarrow, pydantic
    from farm.errors import FarmError
    from farm.output.manifest import default_manifest_name

    run_dir, out = Path(args.run_dir), Path(args.out_dir)
    if not run_dir.is_dir():
        print(f"farm export: {run_dir} is not a directory", file=sys.stderr)
        return 2
    wanted = list(TABLES) if args.table == "all" else [args.table]
    tables = [t for t in wanted if (run_dir / default_manifest_name(t)).is_file()]
    missing = [t for t in wanted if t not in tables]
    if not tables or (args.table != "all" and missing):
        print(f"farm export: {run_dir} has no {' or '.join(missing)} manifest: not a farm output directory",
              file=sys.stderr)  # fmt: skip
        return 2
    refusal = _refusal(run_dir, out, args.format)
    if refusal:
        print(f"farm export: {refusal}", file=sys.stderr)
        return 2
    if args.shard_rows < 1:
        print("farm export: --shard-rows must be at least 1", file=sys.stderr)
        return 2
    try:
        counts = export(run_dir, out, tables=tables, fmt=args.format, compression=args.compression,
                        shard_rows=args.shard_rows)  # fmt: skip
    except FarmError as exc:
        print(f"farm export: {exc}", file=sys.stderr)
        return 1
    for name, c in counts.items():
        n_dup = c["duplicates_dropped"]
        dup = f"; {n_dup} rollout(s) listed twice in the run kept once" if n_dup else ""
        print(f"{name}: {c['rows']} rows of {c['rollouts']} rollouts in {c['shards']} {args.format} shard(s) "
              f"({c['added']} rollouts added){dup} -> {out / name}")  # fmt: skip
    return 0
