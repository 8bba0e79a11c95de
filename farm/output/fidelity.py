"""Token fidelity of an output directory, from its Samples' metadata (``fidelity``,
measured by ``farm.gateway.fidelity``): run totals and the Samples worst first. Used by
``farm inspect --fidelity`` and the run summary."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Iterable, Iterator
from typing import Any


KINDS = ("model_output", "tool_result", "template")


def measured_samples(out: Path) -> Iterator[dict[str, Any]]:
    """One row per measured Sample (``farm.gateway.fidelity``), read one shard at a time."""
    from farm.output.reader import open_sample_reader

    reader = open_sample_reader(out)
    for entry in reader.entries():
        table = reader.read_shard(entry).select(["rollout_id", "chain_index", "chain_kind", "metadata"])
        for rid, chain, kind, meta in zip(*(table[c].to_pylist() for c in table.column_names)):
            fid = json.loads(meta).get("fidelity") if meta else None
            if fid and "error" not in fid:
                yield {"rollout_id": rid, "chain_index": chain, "chain_kind": kind, **fid}


def fidelity_totals(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The run totals of measured Samples, folded as they come (the run summary keeps no
    row per Sample)."""
    n = seen = differing = with_differences = specials = 0
    kinds = dict.fromkeys(KINDS, 0)
    for r in rows:
        n += 1
        seen += r["seen_tokens"]
        differing += r["differing_tokens"]
        with_differences += bool(r["differing_tokens"])
        specials += r.get("special_tokens_in_content", 0)  # special-token text inside content; older records lack it
        for k in KINDS:
            kinds[k] += r[k]
    return {"samples_measured": n, "context_tokens": seen, "differing_tokens": differing,
            "differing_pct": round(100 * differing / seen, 3) if seen else 0.0,
            "samples_with_differences": with_differences, **kinds, "special_tokens_in_content": specials}  # fmt: skip


def fidelity_report(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(run totals, one row per measured Sample, worst first) from the Samples' metadata
    (``farm.gateway.fidelity``)."""
    rows = list(measured_samples(out))
    rows.sort(key=lambda r: (-r["differing_tokens"], r["rollout_id"], r["chain_index"]))
    return fidelity_totals(rows), rows
