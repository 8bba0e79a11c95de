"""The end-of-run summary: counts by status, resolved rate, turns, tokens, wall and busy time,
throughput over busy time (``farm.output.busy``: the report's definition too),
duration percentiles. Printed as a table and written as ``summary.json``."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from farm.output.busy import BusyTime, per_busy_minute, per_busy_second
from farm.output.reader import INVOCATIONS
from farm.output.rows import RolloutSummary
from farm.output.tally import RESOLVED_REWARD, RolloutsTally, directory_rollouts

INVOCATIONS_FILE = INVOCATIONS  # one line per invocation on this output dir (farm run, farm.Farm, farm.Rollouts)
log = logging.getLogger(__name__)


class CumulativeSummary(BaseModel):
    """What the output directory holds, whatever invocation wrote it."""

    model_config = ConfigDict(extra="forbid")

    rollouts: int = 0
    by_status: dict[str, int] = Field(default_factory=dict)
    by_class: dict[str, int] = Field(default_factory=dict, description="policy / infrastructure")
    retried: int = Field(default=0, description="rollouts recorded on a later attempt (attempt > 1)")
    resolved: int = 0
    resolved_rate: float = Field(default=0.0, description="resolved / policy outcomes (infrastructure excluded)")
    mean_reward: float = Field(default=0.0, description="over policy outcomes")
    invocations: int = 0
    groups: int = Field(default=0, description="task groups with at least one recorded rollout")
    groups_complete: int = Field(default=0, description="groups whose every rollout is a trainable outcome")
    groups_incomplete: int = Field(
        default=0, description="groups missing a trainable rollout (an infrastructure failure, or not run yet)"
    )
    incomplete_groups: list[str] = Field(default_factory=list, description="their ids (first 100)")
    grading_flags: dict[str, int] = Field(
        default_factory=dict, description="rollouts per grading flag (runtime:/static:/judge: hack findings, test surface)"
    )
    hack_actions: dict[str, int] = Field(default_factory=dict, description="rollouts a finding zeroed or excluded")


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run_id: str
    planned: int = Field(description="rollouts this invocation planned (after resume skipped done ones)")
    skipped_done: int = Field(default=0, description="rollouts already in the output before this run")
    finished: int = 0
    by_status: dict[str, int] = Field(default_factory=dict)
    resolved: int = 0
    resolved_rate: float = Field(default=0.0, description="resolved / finished (cancelled excluded)")
    mean_reward: float = 0.0
    turns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    wall_s: float = Field(
        default=0.0, description="this invocation's wall time, start-up to exit (Ray, engine, environments, shutdown)"
    )
    busy_s: float = Field(
        default=0.0,
        description="seconds at least one rollout was running: the union of the rollouts' [started_at, finished_at] "
        "(farm.output.busy; what farm report's rates are over too)",
    )
    rollouts_per_min: float = Field(default=0.0, description="finished rollouts per minute of busy time")
    output_tokens_per_s: float = Field(default=0.0, description="output tokens per second of busy time")
    duration_p50_s: float = 0.0
    duration_p95_s: float = 0.0
    redispatched: int = 0
    retried: int = Field(default=0, description="infrastructure retries this invocation")
    interrupted: bool = False
    nodes: dict[str, int] = Field(
        default_factory=dict, description="rollouts finished this invocation per Ray node id (of the actor that ran it)"
    )
    lost_nodes: dict[str, str] = Field(
        default_factory=dict, description="nodes that died holding sandbox actors -> what became of their sandboxes"
    )
    recovery: list[str] = Field(
        default_factory=list, description="what opening the output directory repaired (farm.output.recovery)"
    )
    fidelity: dict[str, Any] | None = Field(
        default=None, description="token fidelity of the output's Samples (farm.output.fidelity): context "
        "tokens, tokens differing from a fresh chat-template render, by kind",
    )
    cumulative: CumulativeSummary | None = Field(
        default=None, description="the whole output directory, across every invocation (from the rollouts table)"
    )


def summarize(
    run_id: str,
    summaries: Sequence[RolloutSummary],
    *,
    planned: int,
    skipped_done: int = 0,
    wall_s: float,
    redispatched: int = 0,
    retried: int = 0,
    interrupted: bool = False,
) -> RunSummary:
    """The summary of rollouts at hand (a run keeps a ``SummaryTally`` as they finish)."""
    return SummaryTally.of(summaries).summary(run_id, planned=planned, skipped_done=skipped_done, wall_s=wall_s,
                                              redispatched=redispatched, retried=retried,
                                              interrupted=interrupted)  # fmt: skip


class Durations:
    """Percentiles of rollout durations in bounded memory: exact (the values themselves, as
    ``np.percentile`` over a list gives) up to ``exact`` values, then a log-bucketed sketch
    (DDSketch-style: every quantile within ``accuracy`` relative error) whose size depends on
    the range of durations (~1,800 buckets from 1 ms to a day at 0.5%), never their number."""

    def __init__(self, exact: int = 4096, accuracy: float = 0.005) -> None:
        self.exact = exact
        self._values: list[float] | None = []
        self._gamma = (1 + accuracy) / (1 - accuracy)
        self._log_gamma = math.log(self._gamma)
        self._buckets: Counter[int] = Counter()
        self._zeros = 0  # durations <= 0 (a rollout the driver recorded itself)
        self.count = 0

    def add(self, value: float) -> None:
        self.count += 1
        if self._values is not None:
            self._values.append(value)
            if len(self._values) > self.exact:  # from now on: the sketch
                values, self._values = self._values, None
                for v in values:
                    self._bucket(v)
            return
        self._bucket(value)

    def _bucket(self, value: float) -> None:
        if value <= 0.0:
            self._zeros += 1
        else:
            self._buckets[math.ceil(math.log(value) / self._log_gamma)] += 1

    def percentile(self, q: float) -> float:
        if not self.count:
            return 0.0
        if self._values is not None:
            return float(np.percentile(np.array(self._values, dtype=np.float64), q))
        rank = q / 100.0 * (self.count - 1)
        seen = self._zeros
        if rank < seen:
            return 0.0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if rank < seen:
                return 2.0 * self._gamma**key / (self._gamma + 1.0)  # the bucket's midpoint (relative)
        return 2.0 * self._gamma ** max(self._buckets) / (self._gamma + 1.0)


class SummaryTally:
    """The run summary kept as rollouts finish (``add``), in memory that does not grow with
    the number of rollouts: counts, sums and ``Durations``. ``summary()`` gives what
    ``summarize`` gives over the same rollouts (the percentiles exactly up to
    ``Durations.exact`` finished rollouts, within its accuracy beyond)."""

    def __init__(self) -> None:
        self.count = 0
        self.by_status: Counter[str] = Counter()
        self.finished = 0
        self.resolved = 0
        self._reward_sum = self._reward_err = 0.0  # a compensated (Neumaier) sum: as exact as np.mean's
        self.turns = self.prompt_tokens = self.output_tokens = 0
        self.durations = Durations()
        self.nodes: Counter[str] = Counter()
        self.busy = BusyTime()

    @classmethod
    def of(cls, summaries: Iterable[RolloutSummary]) -> SummaryTally:
        tally = cls()
        for s in summaries:
            tally.add(s)
        return tally

    def add(self, s: RolloutSummary) -> None:
        self.count += 1
        self.by_status[s.status.value] += 1
        self.turns += s.turns
        self.prompt_tokens += s.prompt_tokens
        self.output_tokens += s.output_tokens
        self.busy.add(s.started_at, s.finished_at)  # a cancelled rollout ran too (an interrupted one has no times)
        if s.status.reruns:  # cancelled / interrupted: counted, not a finished rollout
            return
        self.finished += 1
        self.resolved += s.reward >= RESOLVED_REWARD
        total = self._reward_sum + s.reward
        if abs(self._reward_sum) >= abs(s.reward):
            self._reward_err += (self._reward_sum - total) + s.reward
        else:
            self._reward_err += (s.reward - total) + self._reward_sum
        self._reward_sum = total
        self.durations.add(s.duration_s)
        if s.node:
            self.nodes[s.node] += 1

    def __len__(self) -> int:
        return self.count

    def summary(
        self, run_id: str, *, planned: int, skipped_done: int = 0, wall_s: float, redispatched: int = 0,
        retried: int = 0, interrupted: bool = False,
    ) -> RunSummary:
        n, busy = self.finished, self.busy.seconds
        return RunSummary(
            run_id=run_id,
            planned=planned,
            skipped_done=skipped_done,
            finished=n,
            by_status={k: self.by_status[k] for k in sorted(self.by_status)},
            resolved=self.resolved,
            resolved_rate=self.resolved / n if n else 0.0,
            mean_reward=(self._reward_sum + self._reward_err) / n if n else 0.0,
            turns=self.turns,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            wall_s=wall_s,
            busy_s=busy,
            rollouts_per_min=per_busy_minute(n, busy),
            output_tokens_per_s=per_busy_second(self.output_tokens, busy),
            duration_p50_s=self.durations.percentile(50),
            duration_p95_s=self.durations.percentile(95),
            redispatched=redispatched,
            retried=retried,
            interrupted=interrupted,
            nodes=dict(sorted(self.nodes.items())),
        )


def cumulative(rows: Sequence[dict], invocations: int, group_size: int = 1) -> CumulativeSummary:
    """Counts over every recorded rollout (rows of the rollouts table), every group kept."""
    tally = CumulativeTally(group_size, keep_complete=True)
    tally.add(rows)
    return tally.summary(invocations)


class CumulativeTally(RolloutsTally):
    """``cumulative`` folded batch by batch (:class:`farm.output.tally.RolloutsTally`): the
    run's end and ``farm inspect`` start from the rollouts checkpoint's counts and fold
    the rows after it (:func:`directory_summary`), one shard at a time. What it keeps is one
    small state per incomplete group, not per row."""

    def summary(self, invocations: int) -> CumulativeSummary:
        incomplete = self.incomplete()
        return CumulativeSummary(
            rollouts=self.rollouts,
            by_status={k: self.by_status[k] for k in sorted(self.by_status)},
            by_class={k: self.by_class[k] for k in sorted(self.by_class)},
            retried=self.retried,
            resolved=self.resolved,
            resolved_rate=self.resolved / self.policy if self.policy else 0.0,
            mean_reward=self.reward_sum / self.policy if self.policy else 0.0,
            invocations=invocations,
            groups=self.groups_total,
            groups_complete=self.groups_total - len(incomplete),
            groups_incomplete=len(incomplete),
            incomplete_groups=incomplete[:100],
            grading_flags={k: self.flags[k] for k in sorted(self.flags)},
            hack_actions={k: self.actions[k] for k in sorted(self.actions)},
        )


def with_history(
    summary: RunSummary, out_dir: str | Path, *, started_at: float, group_size: int = 1, command: str = "run"
) -> RunSummary:
    """Append this invocation to ``invocations.jsonl`` and add the cumulative counts
    (read back from the rollouts table on disk, so they hold across invocations).
    ``command``: what wrote it (``run``: farm run / farm.Farm; ``rollouts``: farm.Rollouts,
    i.e. farm rollout / farm serve)."""
    out = Path(out_dir)
    line = {
        "command": command, "started_at": started_at, "ended_at": time.time(), "planned": summary.planned,
        "skipped_done": summary.skipped_done, "finished": summary.finished, "by_status": summary.by_status,
        "interrupted": summary.interrupted, "retried": summary.retried, "redispatched": summary.redispatched,
        "recovery": summary.recovery,
    }  # fmt: skip
    with open(out / INVOCATIONS_FILE, "a") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        current = directory_summary(out, group_size)
    except Exception as exc:  # noqa: BLE001 - the summary must still be written
        log.warning("cumulative summary: cannot read the rollouts table: %s", exc)
        return summary
    return summary.model_copy(update={"cumulative": current})


def count_invocations(out_dir: str | Path) -> int:
    try:
        return sum(1 for ln in (Path(out_dir) / INVOCATIONS_FILE).read_text().splitlines() if ln.strip())
    except FileNotFoundError:
        return 0


def directory_summary(out_dir: str | Path, group_size: int = 1) -> CumulativeSummary:
    """What ``out_dir`` holds now, read from its rollouts table (whichever command wrote
    the rows): the ``cumulative`` of summary.json, never a stale count. From the rollouts
    checkpoint's counts and the rows after it (every row, one shard at a time, without)."""
    tally = directory_rollouts(out_dir, group_size, CumulativeTally)
    return tally.summary(count_invocations(out_dir))


def write_summary(summary: RunSummary, out_dir: str | Path) -> Path:
    """Atomically write ``summary.json`` next to the shards."""
    path = Path(out_dir) / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(summary.model_dump(), indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def summary_table(summary: RunSummary):
    """A rich Table of the summary."""
    # heavy: rich
    from rich.table import Table

    table = Table(title=f"farm run {summary.run_id}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("planned", str(summary.planned)),
        ("already done (skipped)", str(summary.skipped_done)),
        ("finished", str(summary.finished)),
    ]
    rows += [(f"  {status}", str(n)) for status, n in summary.by_status.items()]
    rows += [
        ("resolved", f"{summary.resolved} ({summary.resolved_rate:.1%})"),
        ("mean reward", f"{summary.mean_reward:.3f}"),
        ("turns", str(summary.turns)),
        ("prompt / output tokens", f"{summary.prompt_tokens} / {summary.output_tokens}"),
        ("wall time (start-up to exit)", f"{summary.wall_s:.1f} s"),
        ("busy time (rollouts running)", f"{summary.busy_s:.1f} s"),
        ("throughput (over busy time)",
         f"{summary.rollouts_per_min:.2f} rollouts/min, {summary.output_tokens_per_s:.1f} tok/s"),
        ("duration p50 / p95", f"{summary.duration_p50_s:.1f} s / {summary.duration_p95_s:.1f} s"),
        ("re-dispatched", str(summary.redispatched)),
    ]
    if summary.retried:
        rows.append(("infrastructure retries", str(summary.retried)))
    if len(summary.nodes) > 1:
        rows.append(("nodes", ", ".join(f"{node[:8]}={n}" for node, n in summary.nodes.items())))
    rows += [(f"lost node {node[:8]}", what) for node, what in summary.lost_nodes.items()]
    if summary.interrupted:
        rows.append(("interrupted", "yes (rerun to resume)"))
    c = summary.cumulative
    if c is not None:
        rows.append((f"output dir, all {c.invocations} invocation(s)", f"{c.rollouts} rollouts"))
        rows += [(f"  {cls}", str(n)) for cls, n in c.by_class.items()]
        rows.append(("  resolved (of policy outcomes)", f"{c.resolved} ({c.resolved_rate:.1%})"))
        if c.groups_incomplete:
            rows.append(("  groups complete / incomplete", f"{c.groups_complete} / {c.groups_incomplete}"))
        hacks = {k: n for k, n in c.grading_flags.items() if k.startswith(("runtime:", "static:", "judge:"))}
        if hacks:
            rows.append(("  reward-hack flags", ", ".join(f"{k}={n}" for k, n in hacks.items())))
    f = summary.fidelity
    if f and f.get("samples_measured"):
        rows.append(("token fidelity (vs a fresh render)",
                     f"{f['differing_tokens']}/{f['context_tokens']} tokens differ ({f['differing_pct']}%) in "
                     f"{f['samples_with_differences']}/{f['samples_measured']} Samples"))  # fmt: skip
        if f.get("special_tokens_in_content"):
            rows.append(("  special tokens inside content", str(f["special_tokens_in_content"])))
    for k, v in rows:
        table.add_row(k, v)
    return table
