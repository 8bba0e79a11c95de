"""``farm inspect OUTPUT_DIR``: the run's summary, then one Sample decoded with its
trained spans marked (``[[T>`` ... ``<T]]``, green on a terminal).

The tokenizer comes from the run's saved config (``run_config.yaml``, written by
``farm run``) unless ``--tokenizer`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

OPEN, CLOSE = "[[T>", "<T]]"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="a farm run's output.dir")
    parser.add_argument("--rollout", default=None, help="rollout id of the Sample to decode (default: the first)")
    parser.add_argument("--chain", type=int, default=None, help="chain_index of the Sample (default: the first)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: engine.tokenizer of the run)")
    parser.add_argument("--max-chars", type=int, default=6000, help="truncate the decoded text (0 = no limit)")
    parser.add_argument("--no-sample", action="store_true", help="print the summary only")
    parser.add_argument("--fidelity", action="store_true",
                        help="token fidelity: each Sample's context vs a fresh chat-template render, worst first")
    parser.add_argument("--top", type=int, default=20, help="with --fidelity: Samples listed")


def trained_spans(loss_mask: np.ndarray) -> list[tuple[int, int, bool]]:
    """Runs of equal mask values over the response region: (start, end, trained)."""
    mask = np.asarray(loss_mask, dtype=np.uint8)
    if mask.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(mask)) + 1
    bounds = [0, *cuts.tolist(), int(mask.size)]
    return [(a, b, bool(mask[a])) for a, b in zip(bounds, bounds[1:])]


def render_sample(sample: Any, decode: Any) -> tuple[str, list[tuple[str, bool]]]:
    """(decoded prompt, [(decoded response run, trained)])."""
    tokens = np.asarray(sample.tokens)
    prompt = decode(tokens[: sample.prompt_length].tolist())
    response = tokens[sample.prompt_length :]
    runs = [(decode(response[a:b].tolist()), trained) for a, b, trained in trained_spans(sample.loss_mask)]
    return prompt, runs


def _rollouts_summary(out: Path) -> dict[str, Any]:
    from farm.rollout.store import ROLLOUTS_TABLE
    from farm.trajectory.reader import ShardReader

    reader = ShardReader(out, name=ROLLOUTS_TABLE)
    if not reader.entries():
        return {}
    table = reader.read_table().select(["status", "reward", "turns", "output_tokens"])
    rows = table.to_pylist()
    finished = [r for r in rows if r["status"] != "cancelled"]
    return {
        "rollouts": len(rows),
        "by_status": dict(sorted(Counter(r["status"] for r in rows).items())),
        "resolved": sum(1 for r in finished if r["reward"] >= 1.0),
        "mean_reward": round(sum(r["reward"] for r in finished) / len(finished), 4) if finished else 0.0,
        "turns": sum(r["turns"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
    }


def _unknown_rollout(out: Path, rollout_id: str) -> str | None:
    """Why ``rollout_id`` names no rollout of ``out`` (None: it does). Known = a row of the
    rollouts table or a Sample shard's manifest line (a row may not be durable yet)."""
    from farm.rollout.store import ROLLOUTS_TABLE
    from farm.trajectory.output import open_sample_reader
    from farm.trajectory.reader import ShardReader

    known = ShardReader(out, name=ROLLOUTS_TABLE).rollout_ids() | open_sample_reader(out).rollout_ids()
    if rollout_id in known:
        return None
    near = sorted(r for r in known if rollout_id in r or r in rollout_id)[:5] or sorted(known)[:5]
    return (f"no rollout {rollout_id!r} in {out} ({len(known)} rollouts"
            + (f"; e.g. {', '.join(near)})" if near else ")"))


def _print_artifacts(out: Path, rollout_id: str, console: Any) -> None:
    """The rollout's artifact files (farm.rollout.artifacts) and their sizes."""
    from farm.rollout.artifacts import artifact_dir, read_index

    index = read_index(out, rollout_id)
    if index is None:
        console.print(f"[bold]artifacts[/bold] none for {rollout_id} (artifacts.enabled off, or a run before them)")
        return
    where = artifact_dir(out, rollout_id)
    console.print(f"[bold]artifacts[/bold] {where} (attempt {index.get('attempt')}, {index.get('status')}; "
                  f"zcat to read)", highlight=False, soft_wrap=True)  # fmt: skip
    for f in index.get("files", []):
        cut = f"  truncated: {f['bytes']:,} -> {f['kept_bytes']:,} bytes" if f["truncated"] else ""
        console.print(f"  {f['name']:<18} {f['bytes']:>12,} bytes  ({f['stored_bytes']:,} on disk){cut}",
                      highlight=False, markup=False, soft_wrap=True)  # fmt: skip


def _print_fidelity(out: Path, args: argparse.Namespace, console: Any) -> int:
    from farm.trajectory.fidelity import fidelity_report

    totals, rows = fidelity_report(out)
    console.print("[bold]token fidelity[/bold] (context the engine saw vs a fresh chat-template render)")
    console.print_json(json.dumps(totals))
    if not rows:
        console.print("no Sample carries a fidelity record (gateway.fidelity: off, or an older run)")
        return 0
    for r in rows[: args.top]:
        console.print(f"  {r['rollout_id']} chain={r['chain_index']} ({r['chain_kind']}): "
                      f"{r['differing_tokens']}/{r['seen_tokens']} tokens differ: model_output={r['model_output']} "
                      f"tool_result={r['tool_result']} template={r['template']} "
                      f"special_tokens_in_content={r.get('special_tokens_in_content', 0)}")  # fmt: skip
    worst = rows[0]
    if worst["differing_tokens"] and worst.get("runs"):
        tok = _load_tokenizer(out, args.tokenizer)
        console.print(f"[bold]worst Sample[/bold] {worst['rollout_id']} chain={worst['chain_index']}: first differences")
        for run in worst["runs"]:
            console.print(f"  at token {run['at']} ({run['kind']}):", highlight=False)
            console.print(f"    engine saw: {tok.decode(run['seen'], skip_special_tokens=False)!r}", markup=False)
            console.print(f"    re-render : {tok.decode(run['fresh'], skip_special_tokens=False)!r}", markup=False)
    return 0


def _load_tokenizer(out: Path, spec: str | None) -> Any:
    from farm.model.tokenizer import load_tokenizer

    cache_dir = None
    if spec is None:
        import yaml

        cfg_path = out / "run_config.yaml"
        if not cfg_path.exists():
            raise SystemExit(f"farm inspect: {cfg_path} is missing; pass --tokenizer")
        engine = (yaml.safe_load(cfg_path.read_text()) or {}).get("engine", {})
        spec = engine.get("tokenizer", "builtin:farm-test")
        cache_dir = engine.get("tokenizer_cache_dir")
    return load_tokenizer(spec, cache_dir)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.text import Text

    from farm.trajectory.output import open_sample_reader
    from farm.trajectory.schema import table_to_samples

    console = Console()
    out = Path(args.output_dir)
    if not out.is_dir():
        print(f"farm inspect: {out} is not a directory", file=sys.stderr)
        return 2
    if args.rollout is not None:
        problem = _unknown_rollout(out, args.rollout)
        if problem:  # checked first: a typo'd id must not look like a run that has nothing to show
            print(f"farm inspect: {problem}", file=sys.stderr)
            return 1
    summary_path = out / "summary.json"
    if summary_path.exists():
        console.print_json(summary_path.read_text())
    if args.fidelity:
        return _print_fidelity(out, args, console)
    table = _rollouts_summary(out)
    console.print("[bold]rollouts table[/bold]")
    console.print_json(json.dumps(table))
    if args.rollout is not None:
        _print_artifacts(out, args.rollout, console)
    if args.no_sample:
        return 0
    reader = open_sample_reader(out)
    sample = None
    for entry in reader.entries():
        if args.rollout is not None and args.rollout not in entry.rollout_ids:
            continue
        for s in table_to_samples(reader.read_shard(entry)):
            if (args.rollout is None or s.rollout_id == args.rollout) and (args.chain is None or s.chain_index == args.chain):
                sample = s
                break
        if sample is not None:
            break
    if sample is None:
        which = f"rollout {args.rollout!r}" if args.rollout is not None else "the run"
        chain = f" with chain_index {args.chain}" if args.chain is not None else ""
        print(f"farm inspect: {which} has no Sample{chain} (nothing trained, or no session)", file=sys.stderr)
        return 1
    tok = _load_tokenizer(out, args.tokenizer)

    def decode(ids: list[int]) -> str:
        return tok.decode(ids, skip_special_tokens=False)

    prompt, runs = render_sample(sample, decode)
    trained = int(np.asarray(sample.loss_mask).sum())
    console.print(
        f"[bold]Sample[/bold] rollout={sample.rollout_id} chain={sample.chain_index} ({sample.chain_kind}) "
        f"status={sample.status} reward={sample.reward} turns={sample.num_turns} tokens={len(sample.tokens)} "
        f"prompt={sample.prompt_length} response={sample.response_length} trained={trained}"
    )
    text = Text()
    text.append(prompt, style="dim")
    for chunk, is_trained in runs:
        if is_trained:
            text.append(OPEN + chunk + CLOSE, style="bold green")
        else:
            text.append(chunk, style="dim")
    if args.max_chars and len(text) > args.max_chars:
        text = text[-args.max_chars :]
        console.print(f"(showing the last {args.max_chars} characters)")
    console.print(text, highlight=False, markup=False)
    return 0
