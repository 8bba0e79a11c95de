"""Token fidelity of an output directory, from its Samples' metadata (``fidelity``,
measured by ``farm.gateway.fidelity``): run totals and the Samples worst first. Used by
``farm inspect --fidelity`` and the run summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def fidelity_report(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(run totals, one row per measured Sample, worst first) from the Samples' metadata
    (``farm.gateway.fidelity``)."""
    from farm.output.reader import open_sample_reader

    reader = open_sample_reader(out)
    rows = []
    for entry in reader.entries():
        table = reader.read_shard(entry).select(["rollout_id", "chain_index", "chain_kind", "metadata"])
        for rid, chain, kind, meta in zip(*(table[c].to_pylist() for c in table.column_names)):
            fid = json.loads(meta).get("fidelity") if meta else None
            if fid and "error" not in fid:
                rows.append({"rollout_id": rid, "chain_index": chain, "chain_kind": kind, **fid})
    kinds = ("model_output", "tool_result", "template")
    seen = sum(r["seen_tokens"] for r in rows)
    differing = sum(r["differing_tokens"] for r in rows)
    totals = {"samples_measured": len(rows), "context_tokens": seen, "differing_tokens": differing,
              "differing_pct": round(100 * differing / seen, 3) if seen else 0.0,
              "samples_with_differences": sum(1 for r in rows if r["differing_tokens"]),
              **{k: sum(r[k] for r in rows) for k in kinds},
              # special-token text inside content (farm.gateway.specials); older records lack it
              "special_tokens_in_content": sum(r.get("special_tokens_in_content", 0) for r in rows)}  # fmt: skip
    rows.sort(key=lambda r: (-r["differing_tokens"], r["rollout_id"], r["chain_index"]))
    return totals, rows
