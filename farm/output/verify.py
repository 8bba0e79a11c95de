"""Read-only check of an output directory's tables against their manifests
(``farm verify``): one :class:`Problem` per thing that is wrong, nothing changed.

Per table (every ``*manifest.jsonl``): corrupt or torn manifest lines; listed shards
that are missing, the wrong size, damaged (checksum) or unreadable; shard files no line
lists; leftover temporary files; a rollout listed by two shards. Across the ``samples``
and ``rollouts`` tables: a rollout whose row promises Samples that are not all there,
and Samples without a row.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from farm.errors import ShardError
from farm.output.integrity import read_shard_file, verify_bytes
from farm.output.manifest import ManifestEntry, read_manifest

SUFFIXES = (".arrow", ".parquet")


@dataclass(frozen=True)
class Problem:
    where: str  # a shard, a manifest, or a rollout id
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


# what one row of each table is (``farm verify`` counts them apart: a Sample is not a rollout)
ROW_NAMES = {"samples": "Samples", "rollouts": "rollout rows", "transcripts": "transcript turns"}


@dataclass
class VerifyResult:
    problems: list[Problem]
    shards: int = 0
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows read from its readable shards

    def rows_line(self) -> str:
        """``12 Samples, 13 rollout rows, 0 transcript turns``: per table, never summed."""
        return ", ".join(f"{n:,} {ROW_NAMES.get(t, t + ' rows')}" for t, n in self.rows.items()) or "no rows"


def table_names(out: Path) -> dict[str, Path]:
    """Table name -> manifest path, for every manifest in ``out``."""
    tables = {}
    for m in sorted(out.glob("*manifest.jsonl")):
        name = "samples" if m.name == "manifest.jsonl" else m.name[: -len(".manifest.jsonl")]
        tables[name] = m
    return tables


def _check_table(out: Path, name: str, manifest: Path, res: VerifyResult) -> dict[str, pa.Table]:
    tables: dict[str, pa.Table] = {}
    try:
        read = read_manifest(manifest)
    except ShardError as exc:
        res.problems.append(Problem(manifest.name, f"corrupt manifest: {exc} (--repair rebuilds it from the shards)"))
        return tables
    if read.truncated_tail:
        res.problems.append(Problem(manifest.name, "torn last line (a crash mid-append; --repair cuts it off)"))
    entries: list[ManifestEntry] = [e for e in read.entries if e.table == name]
    res.rows.setdefault(name, 0)
    seen: Counter[str] = Counter(rid for e in entries for rid in e.rollout_ids)
    for rid, n in seen.items():
        if n > 1:
            res.problems.append(Problem(rid, f"listed by {n} shards of {name}"))
    for e in entries:
        path = out / e.shard
        res.shards += 1
        if not path.is_file():
            res.problems.append(Problem(e.shard, f"missing ({len(e.rollout_ids)} rollouts' rows gone)"))
            continue
        if path.stat().st_size != e.bytes:
            res.problems.append(Problem(e.shard, f"size {path.stat().st_size} != manifest {e.bytes}"))
            continue
        try:
            verify_bytes(e.shard, e.checksum, path.read_bytes())
            table = read_shard_file(path, e.format)
        except ShardError as exc:
            res.problems.append(Problem(e.shard, str(exc).split(": ", 1)[-1]))
            continue
        res.rows[name] = res.rows.get(name, 0) + table.num_rows
        tables[e.shard] = table
    listed = {out / e.shard for e in entries}
    table_dir = out / name
    if table_dir.is_dir():
        for p in sorted(table_dir.iterdir()):
            if p.name.startswith(".") and p.name.endswith(".tmp"):
                res.problems.append(Problem(str(p.relative_to(out)), "leftover temporary file"))
            elif p.suffix in SUFFIXES and p not in listed:
                res.problems.append(Problem(str(p.relative_to(out)), "no manifest line lists it (--repair adopts or "
                                            "quarantines it)"))  # fmt: skip
    return tables


def verify_dir(out: str | Path) -> VerifyResult:
    """Check every table of ``out`` and the agreement of ``samples`` with ``rollouts``."""
    out = Path(out)
    res = VerifyResult(problems=[])
    names = table_names(out)
    if not names:
        res.problems.append(Problem(str(out), "no manifest: not a farm output directory"))
        return res
    read = {name: _check_table(out, name, m, res) for name, m in names.items()}
    samples, rollouts = read.get("samples"), read.get("rollouts")
    if samples is not None and rollouts is not None:
        have: Counter[str] = Counter()
        for t in samples.values():
            have.update(t.column("rollout_id").to_pylist())
        promised: dict[str, int] = {}
        for t in rollouts.values():
            for row in t.select(["rollout_id", "num_samples"]).to_pylist():
                promised.setdefault(row["rollout_id"], row["num_samples"])
        for rid, n in sorted(promised.items()):
            if have[rid] != n:
                res.problems.append(Problem(rid, f"row promises {n} Samples, {have[rid]} committed (--repair "
                                            f"retracts it so it runs again)"))  # fmt: skip
        for rid in sorted(set(have) - set(promised)):
            res.problems.append(Problem(rid, "Samples without a rollouts row (--repair rebuilds the row)"))
    return res
