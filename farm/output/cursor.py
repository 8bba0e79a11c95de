"""A GroupReader's position: where a trainer that stopped can pick the stream up again
without reading the manifest lines before it (a run of a million rollouts has ~10^5
of them per table).

A :class:`GroupCursor` holds, per table (``samples``, ``rollouts``), the byte offset of
the manifest the reader had read up to and the hash of the line that ends there, plus
the state of the groups not handed out yet at that point: the rows of groups still
waiting for rollouts, the groups done but held back (``order="task"``) and the groups
handed out but not consumed (a source's buffer), each with the shards its Samples are
in (read again on resume: no Sample is copied into the cursor). Groups already handed
out are not in it: a resumed reader starts after them.

A cursor is valid while the manifests' first ``offset`` bytes are what the reader read:
lines are only ever appended, except by a recovery or a retraction, which rewrite the
manifest (a rollout lost there runs again, and a group handed out may then be handed out
again). Opening from a cursor checks each table's covered last line and raises
:class:`~farm.errors.CursorError` saying why when it no longer matches; the caller
decides whether to read from the start instead.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from farm.errors import CursorError
from farm.output.checkpoint import last_line
from farm.output.manifest import write_durable

CURSOR_VERSION = 1


def _line_hash(line: bytes) -> str:
    return "xxh3_128:" + xxhash.xxh3_128_hexdigest(line)


@dataclass(frozen=True)
class TablePosition:
    """How far a reader read one table's manifest: ``offset`` bytes, the last of them
    the line starting at ``line_start`` whose hash is ``line_hash`` ("" at offset 0)."""

    offset: int = 0
    line_start: int = 0
    line_hash: str = ""

    @classmethod
    def at(cls, manifest: Path, offset: int) -> TablePosition:
        start, line = last_line(manifest, offset)
        return cls(offset=offset, line_start=start, line_hash=_line_hash(line) if line else "")

    def mismatch(self, manifest: Path) -> str | None:
        """Why ``manifest`` no longer starts with what this position covers (None: it does)."""
        if self.offset == 0:
            return None
        try:
            size = os.stat(manifest).st_size
        except FileNotFoundError:
            return f"{manifest.name} is missing"
        if size < self.offset:
            return f"{manifest.name} has {size} bytes, the cursor is at byte {self.offset}"
        with open(manifest, "rb") as fh:
            before = max(0, self.line_start - 1)
            fh.seek(before)
            got = fh.read(self.offset - before)
        if self.line_start and got[:1] != b"\n":
            return f"{manifest.name} was rewritten (no line starts where the cursor's last line did)"
        if _line_hash(got[1:] if self.line_start else got) != self.line_hash:
            return f"{manifest.name} was rewritten (its line before byte {self.offset} differs)"
        return None


@dataclass(frozen=True)
class HeldGroup:
    """A group's rows (the first of each sample index; its Samples are found through the
    cursor's ``sample_shards``) and its arrival order: what a resumed reader rebuilds it from."""

    group_id: str
    rows: list[dict[str, Any]]
    seen_at: int = 0


@dataclass(frozen=True)
class GroupCursor:
    """A GroupReader's position (see the module doc). ``to_json`` / ``from_json`` give
    a small JSON document (its size grows with the groups in flight, not the run)."""

    size: int
    order: str
    next_index: int  # order="task": the next group index to hand out
    yielded: int  # groups handed out (and consumed) before it
    tables: dict[str, TablePosition]
    pending: list[HeldGroup] = field(default_factory=list)  # not done: waiting for rows or Samples
    held: list[HeldGroup] = field(default_factory=list)  # done, held back for an earlier group (order="task")
    unconsumed: list[HeldGroup] = field(default_factory=list)  # handed out, not consumed: handed out first
    sample_shards: list[dict[str, Any]] = field(default_factory=list)  # {"entry": manifest line, "rollout_ids": [...]}
    version: int = CURSOR_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> GroupCursor:
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise TypeError("not a JSON object")
            if raw.get("version") != CURSOR_VERSION:
                raise CursorError(f"group cursor version {raw.get('version')!r}: this farm reads version "
                                  f"{CURSOR_VERSION}")  # fmt: skip
            groups = {k: [HeldGroup(**g) for g in raw.get(k, [])] for k in ("pending", "held", "unconsumed")}
            return cls(size=int(raw["size"]), order=str(raw["order"]), next_index=int(raw["next_index"]),
                       yielded=int(raw["yielded"]),
                       tables={t: TablePosition(**p) for t, p in raw["tables"].items()},
                       sample_shards=list(raw.get("sample_shards", [])), version=CURSOR_VERSION,
                       **groups)  # fmt: skip
        except CursorError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CursorError(f"not a group cursor: {type(exc).__name__}: {exc}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write to ``path`` atomically (temp file, fsync, rename)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        write_durable(tmp, self.to_json().encode())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> GroupCursor:
        try:
            return cls.from_json(Path(path).read_bytes())
        except OSError as exc:
            raise CursorError(f"cannot read group cursor {path}: {exc}") from None
