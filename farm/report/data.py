"""What a report shows, read from an output directory only (never the live farm, no Ray).

Reads what the manifests list, so a run still in progress reports its durable part:
the rollouts table (one light row per rollout for the table and the plots, plus the
per-rollout detail: diff, test results, timings) and the Sample shards, decoded turn by
turn with the run's tokenizer. A Sample's response region is cut into runs of equal
``loss_mask``: trained runs are model outputs (kept per token with their logprob),
untrained runs are what came between them (tool results, template, outputs this chain
does not train because an earlier chain does).
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from farm.errors import ShardError
from farm.output.artifacts import artifact_dir, read_index, read_text
from farm.report.stats import fidelity_rows, throughput
from farm.status import RolloutStatus
from farm.output.reader import OutputReader
from farm.output.shard_reader import ShardReader
from farm.trajectory.schema import table_to_samples
from farm.modeltext import tokenizer

RESOLVED_REWARD = 1.0
ERROR_CHARS = 20_000  # of an infrastructure failure's error + traceback, embedded in the page
# the rollout table's columns (the detail view gets the rest)
ROW_COLUMNS = ["rollout_id", "task_id", "attempt", "harness", "status", "reason", "reward", "turns",
               "prompt_tokens", "output_tokens", "num_samples", "duration_s", "actor", "group_id",
               "started_at", "finished_at"]  # fmt: skip
FIDELITY_RUNS = 3  # first differences of a Sample shown decoded


@dataclass
class RunData:
    out: Path
    rows: list[dict[str, Any]]  # ROW_COLUMNS and the grading's flags per rollout, rollouts-table order
    extra: dict[str, dict[str, Any]]  # rollout id -> diff, grading, timings, agent_log_tail
    summary_json: dict[str, Any] | None
    run_config: dict[str, Any]
    skipped: list[str] = field(default_factory=list)  # damaged shards left out, with why
    invocations: list[dict[str, Any]] = field(default_factory=list)  # invocations.jsonl: the commands that wrote it


def load_run(out: Path) -> RunData:
    """The rollouts table and summary.json of ``out`` (Samples are read by ``iter_trajectories``)."""
    rows: list[dict[str, Any]] = []
    extra: dict[str, dict[str, Any]] = {}
    output = OutputReader(out, on_damaged="skip")
    reader = output.rollouts()
    seen: set[str] = set()
    for table in _tables(reader):
        for r in table.to_pylist():
            if r["rollout_id"] in seen:  # a shard adopted again by a recovery: the first row wins
                continue
            seen.add(r["rollout_id"])
            grading = json.loads(r["grading"]) if r["grading"] else None
            # the grading's named findings (diff_touches_tests, runtime:/static:/judge: hacks): counted
            # and filterable on the first page
            rows.append({**{k: r[k] for k in ROW_COLUMNS}, "flags": sorted((grading or {}).get("flags") or [])})
            extra[r["rollout_id"]] = {
                "diff": r["diff"] or "",
                "grading": grading,
                "timings": json.loads(r["timings"]) if r["timings"] else {},
                "agent_log_tail": r["agent_log_tail"] or "",
                "sandbox_id": r["sandbox_id"], "model": r["model"], "group_id": r["group_id"],
                "artifacts": artifacts_view(out, r["rollout_id"]),
            }  # fmt: skip
    return RunData(out, rows, extra, output.summary(), output.run_config(),
                   [f"{e.shard}: {why}" for e, why in reader.skipped], output.invocations())  # fmt: skip


def artifacts_view(out: Path, rollout_id: str) -> dict[str, Any] | None:
    """The rollout's artifact files (linked from its page) and its error + traceback
    (embedded: small, and the first thing to read when infrastructure failed)."""
    index = read_index(out, rollout_id)
    if index is None:
        return None
    error = read_text(out, rollout_id, "error.txt") if any(f["name"] == "error.txt.gz" for f in index["files"]) else None
    return {"dir": artifact_dir(out, rollout_id).name, "files": index["files"], "truncated": index.get("truncated"),
            "error": error[:ERROR_CHARS] if error else None}  # fmt: skip


def _tables(reader: ShardReader) -> Iterator[Any]:
    """Each listed shard's rows; a damaged one is left out and recorded in ``reader.skipped``
    (a report shows what it can and says what it could not read)."""
    for entry in reader.entries():
        try:
            yield reader.read_shard(entry)
        except ShardError as exc:
            reader.skipped.append((entry, str(exc)))


def _policy(status: str) -> bool:
    try:
        return RolloutStatus(status).trainable
    except ValueError:
        return False


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts by status, resolved rate and mean reward over policy outcomes (infrastructure
    failures are not the policy's: summary.json's ``cumulative`` counts the same way),
    tokens, turns, duration percentiles, wall time and throughput (``stats.throughput``)."""
    policy = [r for r in rows if _policy(r["status"])]
    durations = np.array([r["duration_s"] or 0.0 for r in rows], dtype=np.float64)
    resolved = sum(1 for r in policy if (r["reward"] or 0.0) >= RESOLVED_REWARD)

    def pct(q: float) -> float:
        return round(float(np.percentile(durations, q)), 2) if len(durations) else 0.0

    return {
        "rollouts": len(rows),
        "by_status": dict(sorted(Counter(r["status"] for r in rows).items())),
        "policy_outcomes": len(policy),
        "resolved": resolved,
        "resolved_rate": round(resolved / len(policy), 4) if policy else 0.0,
        "mean_reward": round(sum(r["reward"] or 0.0 for r in policy) / len(policy), 4) if policy else 0.0,
        "turns": sum(r["turns"] or 0 for r in rows),
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows),
        "output_tokens": sum(r["output_tokens"] or 0 for r in rows),
        "duration_p50_s": pct(50), "duration_p95_s": pct(95), "duration_max_s": pct(100),
        **throughput(rows),
    }  # fmt: skip


def tokenizer_spec(data: RunData, override: str | None = None) -> tuple[str, str | None]:
    """(spec, cache dir) of the run's tokenizer: ``--tokenizer`` or run_config.yaml's ``engine``."""
    if override:
        return override, None
    engine = data.run_config.get("engine") or {}
    if "tokenizer" not in engine:
        raise FileNotFoundError(f"{data.out / 'run_config.yaml'} names no engine.tokenizer; pass --tokenizer")
    return engine["tokenizer"], engine.get("tokenizer_cache_dir")


@functools.lru_cache(maxsize=4)  # `farm view` re-renders on every change: load once
def load_tokenizer(spec: str, cache_dir: str | None) -> Any:
    return tokenizer.load_tokenizer(spec, cache_dir)  # the gateway's own loading (no torch for a builtin)


class Decoder:
    """Token ids -> text, with a per-id cache for the per-token view of trained runs."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self._piece: dict[int, str] = {}

    def text(self, ids: np.ndarray) -> str:
        return self.tok.decode(ids.tolist(), skip_special_tokens=False)

    def pieces(self, ids: np.ndarray) -> list[str] | None:
        """One string per token, or None when they do not join into the run's text (a
        character split over byte-level tokens): the view then shows the run whole."""
        out = []
        for i in ids.tolist():
            p = self._piece.get(i)
            if p is None:
                p = self._piece[i] = self.tok.decode([i], skip_special_tokens=False)
            out.append(p)
        return out if "".join(out) == self.text(ids) else None


def sample_view(sample: Any, dec: Decoder) -> dict[str, Any]:
    """One Sample as segments: ``prompt``, then alternating ``context`` (untrained) and
    ``output`` (trained: per-token ``[text, logprob]`` pairs, or ``text`` + mean logprob)."""
    tokens = np.asarray(sample.tokens)
    p = sample.prompt_length
    mask = np.asarray(sample.loss_mask, dtype=np.uint8)
    lps = np.asarray(sample.rollout_logprobs, dtype=np.float32)
    segs: list[dict[str, Any]] = [{"kind": "prompt", "text": dec.text(tokens[:p]), "n": int(p)}]
    if mask.size:
        cuts = np.flatnonzero(np.diff(mask)) + 1
        bounds = [0, *cuts.tolist(), int(mask.size)]
        for a, b in zip(bounds, bounds[1:]):
            ids = tokens[p + a : p + b]
            if not mask[a]:
                segs.append({"kind": "context", "text": dec.text(ids), "n": b - a})
                continue
            pieces = dec.pieces(ids)
            lp = [round(float(x), 3) for x in lps[a:b]]
            seg: dict[str, Any] = {"kind": "output", "n": b - a, "start": a}
            if pieces is not None:
                seg["tokens"] = [[t, x] for t, x in zip(pieces, lp)]
            else:
                seg["text"], seg["mean_logprob"] = dec.text(ids), round(float(np.mean(lp)), 3)
            segs.append(seg)
    meta = sample.metadata
    return {
        "chain_index": sample.chain_index, "chain_kind": sample.chain_kind, "final": bool(meta.get("final")),
        "finish_reason": sample.finish_reason, "num_turns": sample.num_turns, "tokens": int(len(tokens)),
        "prompt_length": int(p), "trained": int(mask.sum()), "segments": segs,
        "drift": meta.get("session_drift") or {}, "fidelity": fidelity_view(meta.get("fidelity"), dec),
    }  # fmt: skip


def fidelity_view(record: dict[str, Any] | None, dec: Decoder) -> dict[str, Any] | None:
    """A Sample's fidelity record as a table, and its first differences decoded (what the
    engine saw vs what a fresh render gives), instead of raw JSON."""
    if not record:
        return None
    runs = [{"at": r["at"], "kind": r["kind"], "seen": dec.text(np.asarray(r["seen"], dtype=np.int64)),
             "fresh": dec.text(np.asarray(r["fresh"], dtype=np.int64))}
            for r in (record.get("runs") or [])[:FIDELITY_RUNS]]  # fmt: skip
    return {"rows": fidelity_rows(record), "runs": runs, "more_runs": max(0, len(record.get("runs") or []) - len(runs))}


def iter_trajectories(out: Path, dec: Decoder, skipped: list[str]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(rollout id, its Sample views in chain order), shard by shard as the manifest lists
    them (a rollout's Samples are written together, in one shard)."""
    reader = OutputReader(out, on_damaged="skip").samples()
    done: set[str] = set()
    for table in _tables(reader):
        by_rollout: dict[str, list[Any]] = {}
        for s in table_to_samples(table):
            if s.rollout_id not in done:
                by_rollout.setdefault(s.rollout_id, []).append(s)
        for rid, samples in by_rollout.items():
            done.add(rid)
            yield rid, [sample_view(s, dec) for s in sorted(samples, key=lambda s: s.chain_index)]
    skipped.extend(f"{e.shard}: {why}" for e, why in reader.skipped)


def test_results(grading: dict[str, Any] | None) -> dict[str, Any]:
    """FAIL_TO_PASS / PASS_TO_PASS statuses per test and the grader's verdict."""
    g = grading or {}
    keep = ("resolved", "outcome", "reward", "reason", "flags", "apply_error")
    return {
        "fail_to_pass": g.get("fail_to_pass") or {},
        "pass_to_pass": g.get("pass_to_pass") or {},
        "verdict": {k: g[k] for k in keep if k in g},
    }
