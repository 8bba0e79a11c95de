"""The report's run-level numbers, from the rollouts table's rows: wall time and
throughput, each GRPO group's reward spread, token fidelity as a table.

Time, as the run summary counts it (``farm.output.busy``): busy time is the union of the
rollouts' own [started_at, finished_at] intervals (a run resumed a day later does not count
the day between), next to the span from the first start to the last end and the wall time
of the commands that wrote the directory (``invocations.jsonl``: start-up to exit); the
rates are over busy time. A group's spread is taken
over its policy outcomes (what a trainer normalizes; infrastructure failures are never
trained): a group whose rewards are all equal gives GRPO no signal (every advantage 0).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from farm.output.busy import BusyTime, per_busy_minute, per_busy_second
from farm.status import RolloutStatus


def _policy(status: str) -> bool:
    try:
        return RolloutStatus(status).trainable
    except ValueError:
        return False


def throughput(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Busy time and the span, and rollouts/min, turns/s, output tokens/s over the busy time.
    Rows without times (rebuilt from Samples after a crash) are left out of all of them."""
    timed = [r for r in rows if (r.get("started_at") or 0) > 0 and (r.get("finished_at") or 0) >= r["started_at"]]
    busy = BusyTime.of((r["started_at"], r["finished_at"]) for r in timed)
    s = busy.seconds
    return {
        "timed_rollouts": len(timed), "busy_s": round(s, 1), "span_s": round(busy.span, 1),
        "rollouts_per_min": round(per_busy_minute(len(timed), s), 2),
        "turns_per_s": round(per_busy_second(sum(r["turns"] or 0 for r in timed), s), 3),
        "output_tokens_per_s": round(per_busy_second(sum(r["output_tokens"] or 0 for r in timed), s), 3),
    }  # fmt: skip


def invocations_wall(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The commands that wrote the directory (``invocations.jsonl``): how many, and their
    wall time summed (each from its start-up to its exit)."""
    spans = [ln["ended_at"] - ln["started_at"] for ln in lines
             if isinstance(ln.get("started_at"), (int, float)) and isinstance(ln.get("ended_at"), (int, float))]  # fmt: skip
    return {"invocations": len(spans), "wall_s": round(sum(max(0.0, x) for x in spans), 1)}


def flag_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Rollouts per grading flag (a rollout counts once per flag it has), most frequent first."""
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        for f in set(r.get("flags") or ()):
            counts[f] += 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def group_spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per group (``group_id``), over its policy outcomes: n, mean, std (population, as
    GRPO normalizes), min, max, ``flat`` (every reward equal: no signal); ``excluded``:
    its infrastructure failures. Groups with flat rewards first, then by id."""
    by_group: dict[str, list[float]] = defaultdict(list)
    excluded: dict[str, int] = defaultdict(int)
    for r in rows:
        gid = r.get("group_id") or r["task_id"]
        if _policy(r["status"]):
            by_group[gid].append(float(r["reward"] or 0.0))
        else:
            excluded[gid] += 1
    out = []
    for gid in sorted(set(by_group) | set(excluded)):
        rewards = np.array(by_group.get(gid, []), dtype=np.float64)
        n = len(rewards)
        out.append({
            "group_id": gid, "n": n, "excluded": excluded.get(gid, 0),
            "mean": round(float(rewards.mean()), 4) if n else None, "std": round(float(rewards.std()), 4) if n else None,
            "min": round(float(rewards.min()), 4) if n else None, "max": round(float(rewards.max()), 4) if n else None,
            "flat": bool(n and rewards.min() == rewards.max()),
        })  # fmt: skip
    out.sort(key=lambda g: (not g["flat"], g["group_id"]))
    return out


FIDELITY_LABELS = (
    ("seen_tokens", "context tokens the engine saw"),
    ("fresh_tokens", "tokens a fresh chat-template render gives"),
    ("differing_tokens", "tokens that differ"),
    ("model_output", "  in model outputs (as the model wrote them vs re-rendered)"),
    ("tool_result", "  in tool results"),
    ("template", "  in the template (turn markers, system prompt)"),
    ("special_tokens_in_content", "special tokens inside message content"),
)
TOTAL_LABELS = (
    ("samples_measured", "Samples measured"),
    ("samples_with_differences", "Samples with a difference"),
    ("context_tokens", "context tokens the engine saw"),
    ("differing_tokens", "tokens that differ from a fresh render"),
    ("differing_pct", "share that differs (%)"),
    ("model_output", "  in model outputs"),
    ("tool_result", "  in tool results"),
    ("template", "  in the template"),
    ("special_tokens_in_content", "special tokens inside message content"),
)


def fidelity_rows(record: dict[str, Any] | None, labels: tuple[tuple[str, str], ...] = FIDELITY_LABELS) -> list[list[Any]]:
    """A fidelity record (a Sample's, or the run's totals) as [label, value] rows."""
    if not record:
        return []
    if "error" in record:
        return [["not measured", str(record["error"])]]
    return [[label, record[key]] for key, label in labels if key in record]
