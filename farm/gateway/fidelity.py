"""Token fidelity: how far the context the engine saw is from a fresh chat-template render.

farm sends the engine append-only prompts: each turn's prompt is the previous turn's
exact tokens (its output as generated) plus the rendered new messages. A trainer or a
deployment that re-renders the conversation from messages gets other tokens wherever the
template does not reproduce what the model generated: a think block the template drops
from earlier replies, tool-call JSON re-serialized compact or pretty, a stripped leading
newline, whitespace. This is the train-vs-deploy mismatch RL users keep finding; farm
measures it and changes nothing.

At session close (``gateway.fidelity``: ``ends`` = each chain end, i.e. each Sample's
context, one full render per Sample; ``all`` = every turn; ``off``) the turn's prompt is
compared with ``PromptRenderer.full_prompt`` of the history it answered (common prefix and
suffix by numpy, ``difflib`` only on the middle). Each differing run is counted (the
larger of its two sides, in tokens) where it lies:

- ``model_output``: inside an earlier turn's output as generated (the template renders
  the model's own words differently: think blocks, tool-call JSON). Training on farm's
  Sample trains the tokens the model really produced; a re-rendered context would
  condition later turns on text the model never saw.
- ``tool_result``: inside a tool result's text (the template or a harness rewrote it).
- ``template``: template glue (role headers, separators, newlines around turns).

The record goes in the turn's ``meta["fidelity"]`` (then the Sample's metadata, by
linearization): token counts by kind, both lengths, the first differing runs with
their token ids (bounded) for ``farm inspect --fidelity``, and
``special_tokens_in_content``: how many times a special token's text occurs inside the
context's messages and tools (a tool result printing ``<|im_end|>``): encoded as text
under ``gateway.special_tokens_in_content: text``, as control tokens under ``allow``
(:mod:`farm.gateway.specials`).
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Literal

import numpy as np

from farm.trajectory.drift import common_prefix_length
from farm.trajectory.linearize import chain_layout, chain_ends
from farm.trajectory.records import TurnFlag
from farm.trajectory.tree import TurnTree

log = logging.getLogger(__name__)

FidelityMode = Literal["off", "ends", "all"]
KINDS = ("model_output", "tool_result", "template")
MAX_RUNS = 4  # differing runs kept with their ids
MAX_IDS = 32  # ids kept per side of a run


def differing_runs(seen: np.ndarray, fresh: np.ndarray) -> list[tuple[str, int, int, int, int]]:
    """Non-equal opcodes (tag, i1, i2, j1, j2) between ``seen`` and ``fresh`` (positions
    in each)."""
    if len(seen) == len(fresh) and np.array_equal(seen, fresh):
        return []
    pre = common_prefix_length(seen, fresh)
    room = min(len(seen), len(fresh)) - pre
    suf = min(common_prefix_length(seen[::-1], fresh[::-1]), room)
    a = seen[pre : len(seen) - suf].tolist()
    b = fresh[pre : len(fresh) - suf].tolist()
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    return [(tag, i1 + pre, i2 + pre, j1 + pre, j2 + pre) for tag, i1, i2, j1, j2 in ops if tag != "equal"]


def measure_turn(tree: TurnTree, turn_id: str, renderer: Any, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The fidelity record of one turn's prompt (see the module doc)."""
    rec = tree.get(turn_id)
    history = tree.history(turn_id)
    if rec.response is not None:
        history = history[:-1]
    seen = np.asarray(tree.prompt_ids(turn_id), dtype=np.int32)
    fresh = renderer.prompt_ids(history, tools)
    chain = tree.chain(turn_id)
    outputs = [(a, b) for r, a, b in chain_layout(chain)[0] if r.turn_id != turn_id and b <= len(seen)]
    tool_texts = [str(m.get("content") or "") for m in history if m.get("role") == "tool"]
    counts = dict.fromkeys(KINDS, 0)
    runs = []
    for tag, i1, i2, j1, j2 in differing_runs(seen, fresh):
        n = max(i2 - i1, j2 - j1)
        lo, hi = i1, max(i2, i1 + 1)
        if any(lo < b and a < hi for a, b in outputs):
            kind = "model_output"
        else:
            sides = (renderer.decode(seen[i1:i2].tolist()).strip(), renderer.decode(fresh[j1:j2].tolist()).strip())
            in_tool = any(x and any(x in t for t in tool_texts) for x in sides)
            kind = "tool_result" if in_tool else "template"
        counts[kind] += n
        if len(runs) < MAX_RUNS:
            runs.append({"kind": kind, "at": i1, "seen": seen[i1:i2][:MAX_IDS].tolist(),
                         "fresh": fresh[j1:j2][:MAX_IDS].tolist()})  # fmt: skip
    return {"seen_tokens": int(len(seen)), "fresh_tokens": int(len(fresh)),
            "differing_tokens": sum(counts.values()), **counts, "runs": runs,
            "special_tokens_in_content": renderer.count_content_specials(history, tools)}  # fmt: skip


def measure_session(tree: TurnTree, renderer: Any, tools_by_digest: dict[str, list[dict[str, Any]]],
                    mode: FidelityMode) -> int:  # fmt: skip
    """Record ``meta["fidelity"]`` on the turns ``mode`` asks for; returns how many. A turn
    that cannot be measured (its tools unknown, a render error) says why instead."""
    if mode == "off":
        return 0
    turns = chain_ends(tree) if mode == "ends" else list(tree.turns)
    done = 0
    for rec in turns:
        if TurnFlag.SIDE_REQUEST in rec.flags:
            continue
        tools = tools_by_digest.get(rec.tools_digest)
        if tools is None:
            rec.meta["fidelity"] = {"error": "the request's tools are unknown"}
            continue
        try:
            rec.meta["fidelity"] = measure_turn(tree, rec.turn_id, renderer, tools)
            done += 1
        except Exception as exc:  # noqa: BLE001 - measurement never fails a rollout
            log.warning("fidelity of %s/%s not measured: %s", tree.session_id, rec.turn_id, exc)
            rec.meta["fidelity"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return done
