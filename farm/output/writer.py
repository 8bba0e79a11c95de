"""OutputWriter: the tables of an output directory, committed together.

``manifest.jsonl`` + ``samples/`` hold the Samples (the trainer's contract);
``rollouts.manifest.jsonl`` + ``rollouts/`` hold one row per rollout;
``transcripts.manifest.jsonl`` + ``transcripts/`` hold the turns of black-box rollouts
(a hosted endpoint: canonical messages, no token ids, never Samples). All go through
the trajectory ShardWriter (temp name, fsync, rename, manifest line). A commit writes
the Samples and transcripts first, then the rows; a rollout is done once its row is
durable. No Ray here: the ReducerActor drives it.

On open, the two tables are brought to agreement (after each writer's own recovery,
which verifies every kept shard's checksum): a rollout whose Samples are committed but
whose row is not gets its row rebuilt from them (:meth:`recover`); a rollout whose row
says it has Samples that are not all committed (a samples shard lost or damaged) is
retracted from both tables, so it runs again (:meth:`reconcile`); a transcript whose
rollout has no row is retracted (the rollout runs again and writes it anew).
``recovery_lines()`` says what changed, one line per table.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import yaml

from farm.gateway.endpoints import RolloutMode
from farm.output.artifacts import RolloutArtifacts, clean_partial, write_artifacts
from farm.output.rows import (
    ROLLOUT_SCHEMA,
    SUMMARY_COLUMNS,
    TRANSCRIPT_SCHEMA,
    RolloutRow,
    RolloutSummary,
    migrate_rollouts,
    row_to_summary,
    rows_to_table,
    transcript_table,
)
from farm.output.config import OutputConfig
from farm.output.reader import ROLLOUTS_TABLE, SAMPLES_TABLE, TRANSCRIPTS_TABLE
from farm.trajectory.schema import SAMPLE_SCHEMA, sample_metadata_json, samples_to_table
from farm.output.shard_reader import ShardReader
from farm.output.shards import ShardWriter
from farm.output.tally import ROLLOUT_COLUMNS, FidelityTally, RolloutsTally
from farm.output.groups import group_size_of


class FinishedRollout(Protocol):
    """What the writer takes of a finished rollout (``farm.rollout.model.RolloutResult``):
    its ids, its row and summary as it makes them, its session (a black-box one's
    ``Transcript`` becomes transcript rows) and its artifacts."""

    run_id: str
    rollout_id: str
    task_id: str
    mode: RolloutMode  # black-box: its tree is a Transcript, written as transcript rows
    tree: Any
    artifacts: RolloutArtifacts | None

    def row(self, num_samples: int) -> RolloutRow: ...

    def summary(self) -> RolloutSummary: ...


# when ``OutputWriter`` writes the tables' manifest checkpoints (``_checkpoint_due``)
CHECKPOINT_MIN_LINES, CHECKPOINT_MAX_LINES = 256, 1024
# ... and at the latest after this many rollouts: until a checkpoint, each table keeps the
# ids since the last one as strings (its lines' id lists and its recent set, ~200 bytes a
# rollout), and a commit holds several hundred rollouts at 1,000/s: 1,024 lines of them
# were ~130 MB of a reducer's memory at 10^6 rollouts (bench_scale).
CHECKPOINT_MAX_ROLLOUTS = 65_536


@dataclass
class Batch:
    rollout_ids: list[str] = field(default_factory=list)
    # each rollout's Samples and their metadata column (encoded by ``add``, so a Sample whose
    # metadata is not JSON fails its own rollout); their Arrow table is built by ``commit``,
    # once for the whole batch (``slices``)
    samples: dict[str, list[Any]] = field(default_factory=dict)
    metadata: dict[str, list[str]] = field(default_factory=dict)
    rows: dict[str, RolloutRow] = field(default_factory=dict)
    transcripts: dict[str, pa.Table] = field(default_factory=dict)  # black-box rollouts only
    summaries: dict[str, RolloutSummary] = field(default_factory=dict)
    artifacts: dict[str, RolloutArtifacts] = field(default_factory=dict)


class StoredSummaries(Mapping[str, RolloutSummary]):
    """The durable rollouts' summaries by id, without one object per rollout in memory (a
    run of a million rollouts would keep ~1 KB each): which ids are durable is the rollouts
    table's writer's to say; the last ``cache`` summaries stay in memory (a duplicate
    submit or a lost actor's lookup concerns a recent rollout); an older one is read back
    from its shard."""

    def __init__(self, writer: ShardWriter, reader: ShardReader, cache: int = 4096) -> None:
        self._writer, self._reader, self._cache = writer, reader, cache
        self._recent: OrderedDict[str, RolloutSummary] = OrderedDict()

    def __contains__(self, rollout_id: object) -> bool:
        return isinstance(rollout_id, str) and self._writer.is_durable(rollout_id)

    def __len__(self) -> int:
        return self._writer.durable_count

    def __iter__(self) -> Iterator[str]:
        return iter(self._writer.durable_ids)

    def __getitem__(self, rollout_id: str) -> RolloutSummary:
        if rollout_id not in self:
            raise KeyError(rollout_id)
        summary = self._recent.get(rollout_id)
        if summary is None:
            summary = self._read(rollout_id)
        self.remember(summary)
        return summary

    def remember(self, summary: RolloutSummary) -> None:
        self._recent[summary.rollout_id] = summary
        self._recent.move_to_end(summary.rollout_id)
        while len(self._recent) > self._cache:
            self._recent.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        self._recent.pop(rollout_id, None)

    def _read(self, rollout_id: str) -> RolloutSummary:
        for entry in reversed(self._writer.entries):
            if rollout_id in entry.rollout_ids:
                table = self._reader.read_shard(entry).select(SUMMARY_COLUMNS)
                for row in table.to_pylist():
                    if row["rollout_id"] == rollout_id:
                        return row_to_summary(row)
        raise KeyError(rollout_id)


class OutputWriter:
    def __init__(self, out_dir: str | Path, output: OutputConfig, *, rebuild: bool = False,
                 checkpoints: bool = True, group_size: int | None = None) -> None:  # fmt: skip
        """``rebuild``: a corrupt manifest is rebuilt from its shards (``farm verify --repair``).
        ``checkpoints``: open each table from its manifest checkpoint and keep them
        (:mod:`farm.output.checkpoint`); off, every manifest line is read (as before them).
        ``group_size``: the groups the checkpoints' counts are kept for (default: the
        ``n_samples`` of the directory's ``run_config.yaml``, 1 without one)."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        common = dict(format=output.format, max_bytes=output.shard_max_bytes, compression=output.compression,
                      rebuild_manifest=rebuild, checkpoints=checkpoints)  # fmt: skip
        # This writer decides when to seal (commit), so the writers never seal on their own.
        self.samples = ShardWriter(self.out_dir, SAMPLE_SCHEMA, name=SAMPLES_TABLE, max_rows=1 << 62, **common)
        self.rollouts = ShardWriter(self.out_dir, ROLLOUT_SCHEMA, name=ROLLOUTS_TABLE, max_rows=1 << 62, **common)
        self._common = common
        self.transcripts: ShardWriter | None = None  # opened by the first black-box rollout (or one on disk)
        if (self.out_dir / TRANSCRIPTS_TABLE).is_dir():
            self._transcripts()
        # the writers verified every shard they kept when they opened: no second pass here
        self.samples_reader = ShardReader(self.out_dir, name=SAMPLES_TABLE, verify=False)
        # migrate: shards written before a column existed (``node``) still load
        self.rollouts_reader = ShardReader(self.out_dir, name=ROLLOUTS_TABLE, verify=False, migrate=migrate_rollouts)

        self.partial_artifacts = clean_partial(self.out_dir)  # a crash mid-write: never a half copy
        self.rebuilt_rows = 0
        self.retracted: list[str] = []
        # Both tables opened from checkpoints with nothing after them to repair: a row the
        # rollouts checkpoint covers had its Samples committed before it was written, and
        # none was lost since (a lost one rewrites the manifest: no checkpoint then), so
        # ``reconcile`` checks only the rows after it. The checkpoints are written rollouts
        # first, so the Samples of a row after it are after the samples checkpoint.
        self._tail_only = self.samples.from_checkpoint and self.rollouts.from_checkpoint
        self._promised: dict[str, int] = self._load_promised()  # rollout id -> Samples its row promises (at open)
        self.summaries = StoredSummaries(self.rollouts, self.rollouts_reader)
        # what each table's rows add up to as of its checkpoint (farm.output.tally; None: every
        # row is folded when the next checkpoint is written)
        self.group_size = group_size if group_size is not None else _group_size(self.out_dir)
        self._counts: dict[str, RolloutsTally | FidelityTally | None] = {
            ROLLOUTS_TABLE: RolloutsTally.from_counts(self.rollouts.checkpoint_counts, self.group_size),
            SAMPLES_TABLE: FidelityTally.from_counts(self.samples.checkpoint_counts),
        }
        self._buffer = Batch()
        self.buffered_rows = 0
        self.shards_written: dict[str, int] = {SAMPLES_TABLE: 0, ROLLOUTS_TABLE: 0, TRANSCRIPTS_TABLE: 0}

    def _transcripts(self) -> ShardWriter:
        if self.transcripts is None:
            self.transcripts = ShardWriter(self.out_dir, TRANSCRIPT_SCHEMA, name=TRANSCRIPTS_TABLE, max_rows=1 << 62,
                                           **self._common)  # fmt: skip
            orphans = self.transcripts.durable_ids - self.rollouts.durable_ids
            if orphans:  # a crash between the two commits: the rollout runs again and writes its transcript anew
                self.transcripts.retract(sorted(orphans))
        return self.transcripts

    def _load_promised(self) -> dict[str, int]:
        out: dict[str, int] = {}
        entries = self.rollouts.entries_since_checkpoint if self._tail_only else self.rollouts.entries
        for entry in entries:
            table = self.rollouts_reader.read_shard(entry).select(["rollout_id", "num_samples"])
            for rid, n in zip(table.column("rollout_id").to_pylist(), table.column("num_samples").to_pylist()):
                out.setdefault(rid, n)
        return out

    # --- recovery -------------------------------------------------------------
    def recover(self) -> int:
        """Rebuild rows for rollouts whose Samples are durable but whose row is not."""
        orphans = self.samples.durable_ids
        orphans.difference_update(self.rollouts.durable_ids)
        if not orphans:
            return 0
        rows: dict[str, list[dict[str, Any]]] = {rid: [] for rid in orphans}
        for entry in self.samples.entries:
            if orphans.isdisjoint(entry.rollout_ids):
                continue
            cols = ["run_id", "rollout_id", "group_id", "task_id", "sample_index", "harness", "model",
                    "reward", "status", "num_turns", "metadata"]  # fmt: skip
            for row in self.samples_reader.read_shard(entry).select(cols).to_pylist():
                if row["rollout_id"] in orphans:
                    rows[row["rollout_id"]].append(row)
        for rid in sorted(orphans):
            row = RolloutRow.rebuilt(rid, rows[rid])
            self.rollouts.write_rollout(rid, rows_to_table([row]))
            self.summaries.remember(row_to_summary(row.model_dump()))
            self._promised[rid] = row.num_samples
        self.rollouts.flush()
        self.rebuilt_rows += len(orphans)
        return len(orphans)

    def reconcile(self) -> list[str]:
        """Retract rollouts whose row promises Samples that are not all committed (their
        samples shard was lost or damaged): both tables drop them, so they run again."""
        samples = self.samples.entries_since_checkpoint if self._tail_only else self.samples.entries
        have = self._sample_counts(samples)
        bad = sorted(rid for rid, n in self._promised.items() if have[rid] != n)
        if bad and self._tail_only:  # Samples may sit before the checkpoint (a row rebuilt by ``recover``)
            have = self._sample_counts([e for e in self.samples.entries if not set(bad).isdisjoint(e.rollout_ids)])
            bad = [rid for rid in bad if have[rid] != self._promised[rid]]
        self._promised = {}  # needed only here, once: not kept per rollout for the whole run
        if bad:
            self.samples.retract([rid for rid in bad if have[rid]])
            self.rollouts.retract(bad)
            for rid in bad:
                self.summaries.forget(rid)
            self.retracted.extend(bad)
        self.checkpoint()  # the next open reads only what is written from here on
        return bad

    def _sample_counts(self, entries: list[Any]) -> Counter[str]:
        have: Counter[str] = Counter()
        for entry in entries:
            have.update(self.samples_reader.read_shard(entry).column("rollout_id").to_pylist())
        return have

    def checkpoint(self) -> None:
        """Write every table's manifest checkpoint with what its rows add up to (``_fold``):
        rollouts first, Samples last (see ``_tail_only``). Called between commits only."""
        for w in (self.rollouts, self.transcripts, self.samples):
            if w is not None and (w.entries_since_checkpoint or not w.checkpointed):
                tally = self._fold(w)
                w.checkpoint(tally.to_counts() if tally is not None else None)
                self._counts[w.name] = tally

    def _fold(self, w: ShardWriter) -> RolloutsTally | FidelityTally | None:
        """The counts of ``w``'s table at the checkpoint about to be written: those of its
        last checkpoint and the rows since, read back (every row when there are none)."""
        if w.name not in self._counts:
            return None
        tally = self._counts[w.name] if w.checkpointed else None
        entries = w.entries_since_checkpoint
        if tally is None:
            tally = RolloutsTally(self.group_size) if w is self.rollouts else FidelityTally()
            entries = w.entries
        self._counts[w.name] = None  # folded in place: not the last checkpoint's any more
        for entry in entries:
            if isinstance(tally, RolloutsTally):
                tally.add(self.rollouts_reader.read_shard(entry).select(ROLLOUT_COLUMNS).to_pylist())
            else:
                tally.add_metadata(self.samples_reader.read_shard(entry).column("metadata").to_pylist())
        return tally

    def _checkpoint_due(self) -> bool:
        """After a number of rollouts-table lines that grows with the table (an eighth of
        it, from 256 to 1,024): reading the tail after one costs O(lines since); or after
        ``CHECKPOINT_MAX_ROLLOUTS`` rollouts, whichever comes first (the memory the ids
        since take). Writing one costs the ids since (a segment) and the merges it makes."""
        since = self.rollouts.entries_since_checkpoint
        if sum(e.rows for e in since) >= CHECKPOINT_MAX_ROLLOUTS:
            return True
        return len(since) >= min(CHECKPOINT_MAX_LINES, max(CHECKPOINT_MIN_LINES, self.rollouts.totals["shards"] // 8))

    def recovery_lines(self) -> list[str]:
        """What opening this writer changed (empty: nothing)."""
        lines = [w.recovery.line(w.name) for w in (self.samples, self.rollouts, self.transcripts)
                 if w is not None and w.recovery.changed]  # fmt: skip
        if self.rebuilt_rows:
            lines.append(f"rollouts: rebuilt {self.rebuilt_rows} row(s) from their committed Samples")
        if self.retracted:
            lines.append(f"{len(self.retracted)} rollout(s) whose Samples were lost run again "
                         f"({', '.join(self.retracted[:5])}{', ...' if len(self.retracted) > 5 else ''})")
        return lines

    # --- buffer + commit ---------------------------------------------------------
    def add(self, result: FinishedRollout, samples: list[Any]) -> None:
        rid = result.rollout_id
        if rid in self.summaries or rid in self._buffer.rows:
            return
        metadata = [sample_metadata_json(s) for s in samples]
        self._buffer.rollout_ids.append(rid)
        self._buffer.samples[rid] = samples
        self._buffer.metadata[rid] = metadata
        self._buffer.rows[rid] = result.row(num_samples=len(samples))
        if not result.mode.writes_samples and result.tree is not None and len(result.tree):  # the transcripts table
            rows = result.tree.rows(run_id=result.run_id, rollout_id=rid, task_id=result.task_id)
            self._buffer.transcripts[rid] = transcript_table(rows)
        self._buffer.summaries[rid] = result.summary()
        if result.artifacts is not None:
            self._buffer.artifacts[rid] = result.artifacts
        self.buffered_rows += max(1, len(samples))

    def take_buffer(self) -> Batch:
        batch, self._buffer = self._buffer, Batch()
        self.buffered_rows = 0
        return batch

    def commit(self, batch: Batch) -> dict[str, int]:
        """Samples first (sealed + manifest), then rows. Blocking I/O: run in a thread."""
        written = {SAMPLES_TABLE: 0, ROLLOUTS_TABLE: 0, TRANSCRIPTS_TABLE: 0}
        if not batch.rollout_ids:
            return written
        for arts in batch.artifacts.values():
            # before the rows (``add`` took only rollouts not yet recorded): a recorded rollout
            # has its artifacts; one whose row a crash lost runs again, and the attempt
            # recorded then replaces these
            write_artifacts(self.out_dir, arts)
        fresh = self.samples.write_rollouts(*sample_table(batch))
        if fresh:
            self.samples.flush()
            written[SAMPLES_TABLE] = 1
        if batch.transcripts:
            transcripts = self._transcripts()
            fresh = False
            for rid, table in batch.transcripts.items():
                fresh |= transcripts.write_rollout(rid, table)
            if fresh:
                transcripts.flush()
                written[TRANSCRIPTS_TABLE] = 1
        rows = [batch.rows[rid] for rid in batch.rollout_ids if not self.rollouts.is_durable(rid)]
        if rows:
            self.rollouts.write_rollouts([(row.rollout_id, 1) for row in rows], rows_to_table(rows))
        if rows:
            self.rollouts.flush()
            written[ROLLOUTS_TABLE] = 1
        for row in rows:  # first write wins: a rollout durable before keeps its stored summary
            self.summaries.remember(batch.summaries[row.rollout_id])
        for k, v in written.items():
            self.shards_written[k] += v
        if self._checkpoint_due():
            self.checkpoint()
        return written

    def stats(self) -> dict[str, Any]:
        return {"shards_written": dict(self.shards_written), "buffered_rows": self.buffered_rows}

    def close(self) -> None:
        if not self.samples.closed and not self.rollouts.closed:
            self.checkpoint()
        self.samples.close()
        if self.transcripts is not None:
            self.transcripts.close()
        self.rollouts.close()


def sample_table(batch: Batch) -> tuple[list[tuple[str, int]], pa.Table]:
    """The batch's Samples as one table, with each rollout's id and Sample count (its
    rows, in order): one Arrow build a commit instead of one a rollout (~1 ms each, most
    of a reducer's time per rollout). A shard is one record batch, so its bytes are the
    same as from tables built per rollout (``ShardWriter._seal``)."""
    ids = batch.rollout_ids
    samples = [s for rid in ids for s in batch.samples[rid]]
    metadata = [m for rid in ids for m in batch.metadata[rid]]
    table = samples_to_table(samples, metadata) if samples else SAMPLE_SCHEMA.empty_table()
    return [(rid, len(batch.samples[rid])) for rid in ids], table


def _group_size(out_dir: Path) -> int:

    try:
        return group_size_of(out_dir) if (out_dir / "run_config.yaml").is_file() else 1
    except (OSError, ValueError, TypeError, AttributeError, yaml.YAMLError):  # unreadable: groups of one
        return 1
