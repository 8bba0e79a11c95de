"""Token fidelity of an output directory, from its Samples' metadata (``fidelity``,
measured by ``farm.gateway.fidelity``): run totals and the Samples worst first. Used by
``farm inspect --fidelity``, the report and the run summary (whose totals come from the
Samples checkpoint's counts and the Samples after it: :func:`directory_fidelity`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from farm.output.tally import KINDS, FidelityTally, directory_fidelity, fidelity_of
from farm.output.reader import open_sample_reader

__all__ = ["KINDS", "directory_fidelity", "fidelity_report", "fidelity_totals", "measured_samples"]


def measured_samples(out: Path) -> Iterator[dict[str, Any]]:
    """One row per measured Sample (``farm.gateway.fidelity``), read one shard at a time."""
    reader = open_sample_reader(out)
    for entry in reader.entries():
        table = reader.read_shard(entry).select(["rollout_id", "chain_index", "chain_kind", "metadata"])
        for rid, chain, kind, meta in zip(*(table[c].to_pylist() for c in table.column_names)):
            fid = fidelity_of(meta)
            if fid is not None:
                yield {"rollout_id": rid, "chain_index": chain, "chain_kind": kind, **fid}


def fidelity_totals(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The run totals of measured Samples, folded as they come (no row per Sample kept)."""
    tally = FidelityTally()
    tally.add(rows)
    return tally.totals()


def fidelity_report(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(run totals, one row per measured Sample, worst first) from the Samples' metadata
    (``farm.gateway.fidelity``)."""
    rows = list(measured_samples(out))
    rows.sort(key=lambda r: (-r["differing_tokens"], r["rollout_id"], r["chain_index"]))
    return fidelity_totals(rows), rows
