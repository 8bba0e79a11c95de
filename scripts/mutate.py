#!/usr/bin/env python
"""Mutation check of the token-fidelity core: does every listed mutation fail a test?

Each mutation replaces one exact snippet of the trajectory core (tree, drift,
linearization, records) or the gateway's append path (history, render, specials) with a plausible
bug (an off-by-one, a dropped guard, a swapped condition), runs the tests that guard that
code, and restores the file. A mutation that leaves the tests green *survived*: a line
no test checks. Hand-written (mutmut would mutate every operator of the package and take
hours on 2 cores; this list is the lines whose bugs would corrupt tokens, masks or
logprobs). Run it after a change to any of these files.

Usage: ``python scripts/mutate.py [--only NAME]``. Last line:
``mutate: mutations=N killed=K survived=S``; exit 1 if any survived.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAJ = ["tests/trajectory"]
GATE = ["tests/gateway/test_gateway_sessions.py", "tests/gateway/test_gateway_units.py"]
ROUTING = "tests/gateway/test_gateway_routing.py"
SPECIALS = "tests/gateway/test_gateway_specials.py"
PIECES = "tests/gateway/test_gateway_pieces.py"


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    # linearization
    Mutation("prompt_is_first_kept_output", "farm/trajectory/linearize.py",
             "p = outs[0][1] if outs else length", "p = chain[0].prompt_length", tuple(TRAJ)),
    Mutation("realign_keeps_cut_outputs", "farm/trajectory/linearize.py",
             "            while outs and outs[-1][2] > off:\n                outs.pop()",
             "            pass", tuple(TRAJ)),
    Mutation("mask_shifted_by_one", "farm/trajectory/linearize.py",
             "mask[a - p : b - p] = 1", "mask[a - p + 1 : b - p + 1] = 1", tuple(TRAJ)),
    Mutation("logprobs_shifted", "farm/trajectory/linearize.py",
             "logprobs[a - p : b - p] = rec.output_logprobs", "logprobs[a - p : b - p] = rec.output_logprobs[::-1]",
             tuple(TRAJ)),
    Mutation("turn_trained_twice", "farm/trajectory/linearize.py",
             "if rec.turn_id not in assigned and is_trainable(rec)", "if is_trainable(rec)", tuple(TRAJ)),
    Mutation("side_requests_trained", "farm/trajectory/linearize.py",
             "        and TurnFlag.SIDE_REQUEST not in rec.flags\n", "", tuple(TRAJ)),
    Mutation("error_turns_trained", "farm/trajectory/linearize.py",
             "        and rec.finish_reason is not FinishReason.ERROR\n", "", tuple(TRAJ)),
    Mutation("chain_end_on_realign_child", "farm/trajectory/linearize.py",
             "k.prompt_offset is None or k.prompt_offset == end", "k.prompt_offset is None or k.prompt_offset <= end",
             tuple(TRAJ)),
    Mutation("drift_spans_kept_after_cut", "farm/trajectory/linearize.py",
             "spans = [sp for sp in spans if sp[1] <= off]", "spans = list(spans)", tuple(TRAJ)),
    Mutation("split_reward_not_divided", "farm/trajectory/linearize.py",
             "reward = reward / len(rows)", "reward = reward", tuple(TRAJ)),
    # drift classification
    Mutation("clean_needs_full_parent", "farm/trajectory/drift.py",
             "if d == total:", "if d >= total - 1:", tuple(TRAJ)),
    Mutation("realign_bound_off_by_one", "farm/trajectory/drift.py",
             "if d == 0 or dropped > max_realign_tokens:", "if d == 0 or dropped > max_realign_tokens + 1:",
             tuple(TRAJ)),
    Mutation("common_prefix_off_by_one", "farm/trajectory/drift.py",
             "return n if not neq[first] else first", "return n if not neq[first] else first + 1", tuple(TRAJ)),
    # the tree
    Mutation("append_offset_is_parent_sequence", "farm/trajectory/tree.py",
             "offset=0 if parent_id is None else self._turns[parent_id].sequence_length,",
             "offset=0 if parent_id is None else self._turns[parent_id].prompt_length,", tuple(TRAJ)),
    Mutation("prompt_length_includes_offset", "farm/trajectory/tree.py",
             "prompt_length=offset + len(delta),", "prompt_length=len(delta),", tuple(TRAJ)),
    # the gateway's append path
    Mutation("append_prompt_is_lane_sequence", "farm/gateway/history.py",
             "prompt = np.concatenate([session.tree.sequence_ids(lane.turn_id), delta_ids])",
             "prompt = np.concatenate([session.tree.sequence_ids(lane.turn_id)[:-1], delta_ids])", tuple(GATE)),
    Mutation("echo_must_match", "farm/gateway/history.py",
             "        if echo_matches(lane.response, echo):", "        if True:", tuple(GATE)),
    Mutation("no_assistant_in_delta", "farm/gateway/history.py",
             '        if any(m.get("role") == "assistant" for m in new):', "        if False:", tuple(GATE)),
    Mutation("retry_keeps_parent_prompt", "farm/gateway/history.py",
             "if rec.prompt_offset == session.tree.get(parent).sequence_length:", "if True:", tuple(GATE)),
    Mutation("delta_drops_generated_end", "farm/gateway/render.py",
             "            suffix = suffix[len(generated_end):]", "            suffix = suffix", tuple(GATE)),
    Mutation("delta_needs_prefix_render", "farm/gateway/render.py",
             "if not r1.startswith(r0) or not r0.endswith(self.tail):", "if not r0.endswith(self.tail):",
             tuple(GATE)),
    # MoE routing replay (the experts each token was routed to, kept per trained token) and chain labels
    Mutation("routing_rows_shifted", "farm/trajectory/linearize.py",
             "                out[a:b] = re[: b - a]", "                out[a + 1 : b + 1] = re[: b - a][: max(0, rows - a - 1)]",
             (*TRAJ, ROUTING)),
    Mutation("routing_kept_after_realign", "farm/trajectory/linearize.py",
             "            known[off:] = False\n            out[off:] = 0", "            pass", (*TRAJ, ROUTING)),
    Mutation("routing_start_one_late", "farm/gateway/service.py",
             "tree.get(plan.parent_id).sequence_length - 1)", "tree.get(plan.parent_id).sequence_length)",
             (ROUTING,)),
    Mutation("retry_chain_labelled_main", "farm/trajectory/linearize.py",
             "    if is_retry(tree, chain[-1]):", "    if False:", tuple(TRAJ)),
    # budgets and control tokens in content: a refusal is no model turn; content
    # special-token text is text in full renders and deltas alike
    Mutation("refusal_ends_a_chain", "farm/trajectory/linearize.py",
             "        if not is_refusal(rec) and not any(", "        if not any(", tuple(TRAJ)),
    Mutation("refusal_continues_its_parent", "farm/trajectory/linearize.py",
             "(k.prompt_offset is None or k.prompt_offset == end) and not is_refusal(k) for k in kids",
             "(k.prompt_offset is None or k.prompt_offset == end) for k in kids", tuple(TRAJ)),
    Mutation("content_specials_are_control", "farm/gateway/specials.py",
             "        if self.rule != \"text\" or self.pattern is None:\n            return list(values), found",
             "        if True:\n            return list(values), found", (SPECIALS,)),
    Mutation("delta_content_specials_unmarked", "farm/gateway/render.py",
             "(ctx, new), found = self.specials.mark([_ANCHOR_USER, _anchor(anchor)], list(new))",
             "(ctx, new), found = ([_ANCHOR_USER, _anchor(anchor)], list(new)), []", (SPECIALS,)),
    # whole renders tokenized by pieces, kept by text: the ids of one-string encoding
    Mutation("piece_specials_dropped", "farm/gateway/pieces.py",
             "            parts.append(self.special_ids[m.group(0)])", "            pass", (PIECES,)),
    Mutation("piece_tail_dropped", "farm/gateway/pieces.py",
             "        if pos < len(text):\n            parts.append(text[pos:])",
             "        if pos < len(text) - 1:\n            parts.append(text[pos:])", (PIECES,)),
    Mutation("piece_kept_under_another_text", "farm/gateway/pieces.py",
             "                for p, ids in zip(todo, fresh):", "                for p, ids in zip(todo, fresh[::-1]):",
             (PIECES,)),
    Mutation("pieces_unchecked_on_the_probe", "farm/gateway/pieces.py",
             "            if cache.encode(text) != backend.encode(text, add_special_tokens=False).ids:",
             "            if False:", (PIECES,)),
]


def run(m: Mutation) -> tuple[bool, float]:
    """(killed, seconds): apply, run the tests, restore."""
    path = ROOT / m.path
    original = path.read_text()
    if original.count(m.old) != 1:
        raise SystemExit(f"mutate: {m.name}: the snippet is not in {m.path} exactly once (update the list)")
    t0 = time.monotonic()
    path.write_text(original.replace(m.old, m.new, 1))
    try:
        res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *m.tests],
                             cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    finally:
        path.write_text(original)
    return res.returncode != 0, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", default=[], help="run only these mutations")
    args = ap.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    survived = []
    for m in chosen:
        killed, secs = run(m)
        print(f"{'killed  ' if killed else 'SURVIVED'} {m.name:<34} {m.path} ({secs:.1f} s)", flush=True)
        if not killed:
            survived.append(m.name)
    print(f"mutate: mutations={len(chosen)} killed={len(chosen) - len(survived)} survived={len(survived)}")
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
