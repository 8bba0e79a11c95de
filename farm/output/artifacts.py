"""Per-rollout artifacts: everything a rollout left behind, in files a person can read.

Layout, under the output directory (one directory per recorded rollout)::

    artifacts/<rollout id>/
      index.json          plain JSON: status, reason, attempt, per-phase timings, and per file
                          its size, what was kept and whether the per-rollout cap truncated it
      task.json.gz        the task the rollout was given (farm's Task: id, instruction, workspace
                          source, tests): "what was the task?" (farm inspect, the report)
      agent.stdout.gz     the CLI's whole stdout (its JSON event stream)
      agent.stderr.gz     the CLI's whole stderr
      turns.jsonl.gz      one line per gateway turn: canonical messages it added, the reply
                          (text, thinking, tool calls), token counts, latency, finish reason,
                          weight version, flags
      diff.patch.gz       the final diff
      grading.json.gz     the grading report (F2P/P2P statuses, patch, setup, flags)
      test.log.gz         the test command's whole output
      setup.json.gz       the workspace setup report (each command, exit code, output ends)
      error.txt.gz        an infrastructure failure: the error and its traceback

Everything is gzip (``zcat``, ``zless``, ``gzip.open``). The sandbox actor builds the
bytes (:func:`build_artifacts`: redacted, capped to ``artifacts.max_bytes_per_rollout``
uncompressed, compressed); the reducer writes them (:func:`write_artifacts`) for the
attempt it records, and only that one: into a temp directory, renamed into place
(replacing what an earlier, unrecorded attempt may have left). No Ray here.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from farm.output.manifest import fsync_dir, write_durable
from farm.trajectory.transcript import Transcript

ARTIFACTS_DIR = "artifacts"
INDEX = "index.json"
_TMP, _OLD = ".tmp-", ".old-"
# the order files are listed in (and share the cap in: the small, decisive ones first)
FILES = ("error.txt", "task.json", "grading.json", "setup.json", "diff.patch", "test.log", "turns.jsonl",
         "agent.stderr", "agent.stdout")  # fmt: skip


@dataclass
class RolloutArtifacts:
    """The compressed files of one rollout (what travels from the sandbox actor to the reducer)."""

    rollout_id: str
    files: dict[str, bytes] = field(default_factory=dict)  # name + ".gz" -> gzip bytes
    index: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(len(v) for v in self.files.values())


def artifact_dir(out_dir: str | Path, rollout_id: str) -> Path:
    """Where a rollout's artifacts live (its id, made one safe path component)."""
    return Path(out_dir) / ARTIFACTS_DIR / quote(rollout_id, safe="@+=,-_.")


# --- build (sandbox actor side) ---------------------------------------------------
def turn_line(rec: Any) -> dict[str, Any]:
    """One gateway turn in canonical form (no token ids: those are in the Samples)."""
    timings = {k: round(v, 3) for k, v in (rec.timings or {}).items()}
    return {
        "turn_id": rec.turn_id,
        "parent_id": rec.parent_id,
        "messages": list(rec.messages),
        "response": rec.response,
        "prompt_tokens": int(rec.prompt_length),
        "new_prompt_tokens": len(rec.prompt_delta_ids),
        "output_tokens": len(rec.output_ids),
        "finish_reason": rec.finish_reason.value,
        "latency_ms": round(sum(timings.values()), 3),
        "timings_ms": timings,
        "weight_version": rec.policy_version,
        "trainable": rec.trainable,
        "flags": sorted(f.value for f in rec.flags),
        "created_at": rec.created_at,
        "meta": rec.meta,
    }


def transcript_line(turn: Any) -> dict[str, Any]:
    """One black-box turn (a hosted endpoint's request/reply: no token ids, no tree links)."""
    return {
        "messages": list(turn.messages),
        "tools": list(turn.tools),
        "response": turn.response,
        "protocol": turn.protocol,
        "model": turn.model,
        "prompt_tokens": turn.prompt_tokens,
        "output_tokens": turn.output_tokens,
        "cached_tokens": turn.cached_tokens,
        "finish_reason": turn.finish_reason.value,
        "latency_ms": round(turn.latency_ms, 3),
        "attempts": turn.attempts,
        "trainable": False,
        "flags": sorted(f.value for f in turn.flags),
    }


def turns_jsonl(tree: Any) -> str:
    """The session's turns, one JSON line each: a token-exact turn tree's records, or a
    black-box transcript's turns (farm.trajectory.transcript)."""
    if tree is None:
        return ""
    line = transcript_line if isinstance(tree, Transcript) else turn_line
    return "".join(json.dumps(line(rec), default=str) + "\n" for rec in tree.turns)


def _shares(sizes: dict[str, int], cap: int) -> dict[str, int]:
    """Split ``cap`` bytes over the files: smallest first, each at most an even share of
    what is left (a huge event stream cannot crowd out the diff or the error)."""
    out: dict[str, int] = {}
    left = cap
    order = sorted(sizes, key=lambda n: sizes[n])
    for i, name in enumerate(order):
        out[name] = min(sizes[name], left // (len(order) - i))
        left -= out[name]
    return out


def _cut(data: bytes, keep: int, jsonl: bool) -> bytes:
    """Head and tail of ``data`` within ``keep`` bytes, cut at line ends, with a marker."""
    keep = max(0, keep - 100)  # room for the marker: the cap holds
    head = data[: keep // 2]
    tail = data[len(data) - (keep - len(head)) :]
    if b"\n" in head:
        head = head[: head.rfind(b"\n") + 1]
    if b"\n" in tail:
        tail = tail[tail.find(b"\n") + 1 :]
    dropped = len(data) - len(head) - len(tail)
    if jsonl:
        marker = json.dumps({"truncated_bytes": dropped, "by": "artifacts.max_bytes_per_rollout"}) + "\n"
    else:
        marker = f"\n[... {dropped} bytes cut by farm (artifacts.max_bytes_per_rollout) ...]\n"
    return head + marker.encode() + tail


def build_artifacts(
    rollout_id: str, texts: dict[str, str], *, cap: int, redact: Any = None, index: dict[str, Any] | None = None
) -> RolloutArtifacts:
    """Compress ``texts`` (file name -> content; empty ones are left out) within ``cap``
    uncompressed bytes. ``redact`` (str -> str) is applied to every text first."""
    raw = {n: (redact(t) if redact else t).encode() for n, t in texts.items() if t}
    shares = _shares({n: len(b) for n, b in raw.items()}, cap)
    arts = RolloutArtifacts(rollout_id, index={"rollout_id": rollout_id, **(index or {}), "max_bytes": cap})
    listing = []
    for name in sorted(raw, key=lambda n: (FILES.index(n) if n in FILES else len(FILES), n)):
        data = raw[name]
        jsonl = name.endswith(".jsonl") or data[:1] == b"{"  # an event stream: the marker is a JSON line too
        kept = data if len(data) <= shares[name] else _cut(data, shares[name], jsonl)
        gz = gzip.compress(kept, compresslevel=6, mtime=0)
        arts.files[name + ".gz"] = gz
        listing.append({"name": name + ".gz", "bytes": len(data), "kept_bytes": len(kept),
                        "stored_bytes": len(gz), "truncated": kept is not data})  # fmt: skip
    arts.index["files"] = listing
    arts.index["truncated"] = any(f["truncated"] for f in listing)
    return arts


# --- write (reducer side) --------------------------------------------------------
def write_artifacts(out_dir: str | Path, arts: RolloutArtifacts) -> Path:
    """Make ``arts`` the rollout's artifacts: written complete into a temp directory,
    then renamed into place. What an earlier attempt of the same rollout left (it was
    not recorded: the reducer writes only the attempt it records) is replaced."""
    final = artifact_dir(out_dir, arts.rollout_id)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{_TMP}{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for name, data in arts.files.items():
            write_durable(tmp / name, data)
        write_durable(tmp / INDEX, (json.dumps(arts.index, indent=1, default=str) + "\n").encode())
        fsync_dir(tmp)
        old = None
        if final.exists():
            old = root / f"{_OLD}{uuid.uuid4().hex}"
            os.rename(final, old)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def clean_partial(out_dir: str | Path) -> int:
    """Remove what a crash mid-write left (temp and replaced directories). Returns how many."""
    root = Path(out_dir) / ARTIFACTS_DIR
    if not root.is_dir():
        return 0
    gone = [p for p in root.iterdir() if p.name.startswith((_TMP, _OLD))]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return len(gone)


# --- read (inspect, report) ------------------------------------------------------
def read_index(out_dir: str | Path, rollout_id: str) -> dict[str, Any] | None:
    """A rollout's index.json, or None when it has no artifacts."""
    try:
        return json.loads((artifact_dir(out_dir, rollout_id) / INDEX).read_text())
    except (OSError, ValueError):
        return None


def read_task(out_dir: str | Path, rollout_id: str) -> dict[str, Any] | None:
    """The task a rollout was given (its ``task.json``), or None (no artifacts, or a run
    from before they kept it)."""
    text = read_text(out_dir, rollout_id, "task.json")
    try:
        task = json.loads(text) if text else None
    except ValueError:  # cut by the per-rollout cap
        return None
    return task if isinstance(task, dict) else None


def read_text(out_dir: str | Path, rollout_id: str, name: str) -> str | None:
    """One artifact file's text (``name`` without or with ``.gz``), or None."""
    path = artifact_dir(out_dir, rollout_id) / (name if name.endswith(".gz") else name + ".gz")
    try:
        return gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
