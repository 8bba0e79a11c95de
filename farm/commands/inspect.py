"""``farm inspect OUTPUT_DIR``: what the directory holds (read from its rollouts table),
the last invocation's summary, then one Sample's task (id, source, the instruction) and
the Sample decoded with its trained spans marked (``[[T>`` ... ``<T]]``, green on a
terminal).

The decoded text keeps its last ``--max-chars`` characters (``--full``: all of it), with a
marker saying what was cut. Lines are never wrapped by inspect (piped output keeps them
whole). The tokenizer comes from the run's saved config (``run_config.yaml``) unless
``--tokenizer`` is given.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
import os

import numpy as np

OPEN, CLOSE = "[[T>", "<T]]"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output_dir", help="a farm run's output.dir")
    parser.add_argument("--rollout", default=None, help="rollout id of the Sample to decode (default: the first)")
    parser.add_argument("--chain", type=int, default=None, help="chain_index of the Sample (default: the first)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec (default: engine.tokenizer of the run)")
    parser.add_argument("--max-chars", type=int, default=6000,
                        help="keep the last N characters of the decoded Sample, the first N of the instruction "
                        "(0 = no limit); a marker says what was cut")
    parser.add_argument("--full", action="store_true", help="the whole decoded Sample and instruction (--max-chars 0)")
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


def _overview(out: Path, console: Any) -> None:
    """What the directory holds, from its rollouts table (whichever command added the
    rows: its checkpoint's counts and the rows after it, farm.output.tally), then the last
    invocation's summary.json, and a note when that one is stale."""
    # heavy: pyarrow, pydantic, xxhash
    from farm.output.groups import group_size_of
    from farm.output.tally import directory_rollouts
    from farm.run.summary import CumulativeTally, count_invocations

    size = group_size_of(out) if (out / "run_config.yaml").is_file() else 1
    tally = directory_rollouts(out, size, CumulativeTally)
    if tally.rollouts:
        now = tally.summary(count_invocations(out)).model_dump()
        now.update(turns=tally.turns, output_tokens=tally.output_tokens)
    else:
        now = {"rollouts": 0}
    console.print(f"[bold]output directory[/bold] {out} (read from its rollouts table)")
    console.print_json(json.dumps(now))
    path = out / "summary.json"
    if not path.exists():
        return
    last = json.loads(path.read_text())
    then = (last.pop("cumulative", None) or {}).get("rollouts")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(path).st_mtime))
    console.print(f"[bold]last invocation[/bold] (summary.json, written {when})")
    console.print_json(json.dumps(last))
    if then is not None and then != now["rollouts"]:
        console.print(f"note: summary.json was written when the directory held {then} rollouts; its rollouts table "
                      f"holds {now['rollouts']} now (added since by another command, or a run still going): the "
                      f"directory's counts above are the table's", style="yellow", highlight=False)  # fmt: skip


def _unknown_rollout(out: Path, rollout_id: str) -> str | None:
    """Why ``rollout_id`` names no rollout of ``out`` (None: it does). Known = a row of the
    rollouts table or a Sample shard's manifest line (a row may not be durable yet)."""
    # heavy: pyarrow, pydantic, xxhash
    from farm.output.reader import OutputReader

    output = OutputReader(out)
    known = output.rollouts().rollout_ids() | output.samples().rollout_ids()
    if rollout_id in known:
        return None
    near = sorted(r for r in known if rollout_id in r or r in rollout_id)[:5] or sorted(known)[:5]
    return (f"no rollout {rollout_id!r} in {out} ({len(known)} rollouts"
            + (f"; e.g. {', '.join(near)})" if near else ")"))


def _print_artifacts(out: Path, rollout_id: str, console: Any) -> None:
    """The rollout's artifact files (farm.output.artifacts) and their sizes."""
    # heavy: pyarrow, pydantic, xxhash
    from farm.output.artifacts import artifact_dir, read_index

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


def _cut(text: str, limit: int, *, keep: str, what: str) -> tuple[str, str | None]:
    """``text`` within ``limit`` characters (its head or its tail), and the marker saying
    what was cut (None: nothing was)."""
    if not limit or len(text) <= limit:
        return text, None
    dropped = len(text) - limit
    part = "first" if keep == "tail" else "last"
    marker = (f"[... the {part} {dropped:,} of {len(text):,} characters of the {what} are cut: --full shows all of "
              f"it, --max-chars N keeps N ...]")  # fmt: skip
    return (text[-limit:], marker) if keep == "tail" else (text[:limit], marker)


def _print_task(out: Path, rollout_id: str, task_id: str, limit: int, console: Any) -> None:
    """What was the task: id, kind, source (repository @ commit), tests, the instruction."""
    # heavy: pyarrow, pydantic, xxhash
    from farm.output.reader import OutputReader
    from farm.report.task import TaskLookup

    lookup = TaskLookup(out, OutputReader(out).run_config())
    view = lookup.get(rollout_id, task_id)
    if view is None:
        why = f" (task file: {lookup.file_error})" if lookup.file_error else ""
        console.print(f"[bold]task[/bold] {task_id}: not recorded (no task.json in the rollout's artifacts, not in "
                      f"the run's task file){why}", highlight=False)  # fmt: skip
        return
    console.print(f"[bold]task[/bold] {view['id']} ({view['kind']}), from {view['origin']}", highlight=False)
    lines = [("source", view["source"]), ("image", view["image"]), ("tests", view["tests"]),
             ("test command", view["test_command"])]  # fmt: skip
    for k, v in lines:
        if v:
            console.print(f"  {k}: {v}", highlight=False, markup=False)
    instruction, marker = _cut(view["instruction"], limit, keep="head", what="instruction")
    console.print("  instruction:", highlight=False)
    console.print(instruction, highlight=False, markup=False)
    if marker:
        console.print(marker, style="yellow", highlight=False, markup=False)


def _print_fidelity(out: Path, args: argparse.Namespace, console: Any) -> int:
    # heavy: pyarrow, pydantic, xxhash
    from farm.output.fidelity import fidelity_report

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
    # the CLI's start-up: a command loads its code when it runs
    from farm.modeltext.tokenizer import load_tokenizer

    cache_dir = None
    if spec is None:
        # heavy: yaml
        import yaml

        cfg_path = out / "run_config.yaml"
        if not cfg_path.exists():
            raise SystemExit(f"farm inspect: {cfg_path} is missing; pass --tokenizer")
        engine = (yaml.safe_load(cfg_path.read_text()) or {}).get("engine", {})
        spec = engine.get("tokenizer", "builtin:farm-test")
        cache_dir = engine.get("tokenizer_cache_dir")
    return load_tokenizer(spec, cache_dir)


def run(args: argparse.Namespace) -> int:
    # heavy: rich
    from rich.console import Console
    from rich.text import Text

    # heavy: pyarrow, pydantic, xxhash
    from farm.output.reader import OutputReader
    from farm.trajectory.schema import table_to_samples

    console = Console(soft_wrap=True)  # never hard-wrapped (piped: not at 80 columns)
    out = Path(args.output_dir)
    limit = 0 if args.full else args.max_chars
    if not out.is_dir():
        print(f"farm inspect: {out} is not a directory", file=sys.stderr)
        return 2
    if args.rollout is not None:
        problem = _unknown_rollout(out, args.rollout)
        if problem:  # checked first: a typo'd id must not look like a run that has nothing to show
            print(f"farm inspect: {problem}", file=sys.stderr)
            return 1
    _overview(out, console)
    if args.fidelity:
        return _print_fidelity(out, args, console)
    if args.rollout is not None:
        _print_artifacts(out, args.rollout, console)
        if args.no_sample:
            _print_task(out, args.rollout, _task_id_of(out, args.rollout), limit, console)
    if args.no_sample:
        return 0
    reader = OutputReader(out).samples()
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

    _print_task(out, sample.rollout_id, sample.task_id, limit, console)
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
    _, marker = _cut(text.plain, limit, keep="tail", what="decoded Sample")
    if marker:
        text = Text(marker + "\n", style="yellow").append_text(text[-limit:])
    console.print(text, highlight=False, markup=False)
    return 0


def _task_id_of(out: Path, rollout_id: str) -> str:
    """A rollout's task id, from its row (else its id's prefix: ``<task id>.<i>``)."""
    # heavy: pyarrow, pydantic, xxhash
    from farm.output.reader import OutputReader

    reader = OutputReader(out).rollouts()
    for entry in reader.entries():
        if rollout_id in entry.rollout_ids:
            rows = reader.read_shard(entry).select(["rollout_id", "task_id"]).to_pylist()
            return next(r["task_id"] for r in rows if r["rollout_id"] == rollout_id)
    return rollout_id.rsplit(".", 1)[0]
