"""The Samples table's columns, documented: one description per column of ``SAMPLE_SCHEMA``
and what a PyTorch row (``farm.output.torch_data.sample_tensors``) makes of it.

``columns_markdown()`` renders the column table of the Samples reference
(``docs/reference/trajectories.md``, between its ``samples-columns`` markers) from the
schema itself (name, Arrow type, nullability) and these descriptions;
``python -m farm.trajectory.columns`` writes it into the page, and a docs test keeps the
committed page equal to it (a column added to the schema without a description fails
there, and here: ``columns_markdown`` refuses).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa

from farm.trajectory.schema import SAMPLE_SCHEMA, SCHEMA_VERSION

PAGE = "docs/reference/trajectories.md"
START, END = "<!-- samples-columns:start (generated: python -m farm.trajectory.columns) -->", "<!-- samples-columns:end -->"
GENERATE = "python -m farm.trajectory.columns"

# column -> what it holds (several columns may share a row: a tuple key)
DESCRIPTIONS: dict[tuple[str, ...], str] = {
    ("run_id",): "the run that wrote it (`run_id`: the output directory's name unless set)",
    ("task_id", "rollout_id", "group_id"): "rollout id `<task_id>.<i>`; group = task (one GRPO group: `rollout.n_samples` rollouts)",
    ("sample_index",): "the rollout's index in its group",
    ("chain_index",): "the chain's index in its rollout (DFS order)",
    ("chain_kind",): "`main`, `retry`, `branch`, `fork` or `side` (below)",
    ("session_id", "harness", "model"): "the gateway session, the CLI that ran, the served model",
    ("group_index",): "v2: the group's position in the run's task stream",
    ("policy_version_min", "policy_version_max"): "v2: oldest / newest weight version of a turn the Sample trains",
    ("tokens",): "prompt + response region",
    ("prompt_length", "response_length"): "they sum to `len(tokens)`",
    ("loss_mask",): "0/1 over the response region (`response_length` entries): 1 on the model output tokens this Sample trains",
    ("rollout_logprobs",): "the engine's logprobs under the mask, 0.0 elsewhere (`response_length` entries)",
    ("reward",): "the rollout's reward (`output.reward_policy: split`: its share)",
    ("status",): "the rollout's status",
    ("finish_reason",): "how the chain's last turn ended",
    ("num_turns",): "model turns in the chain",
    ("metadata",): "a JSON object: reason, attempt, rollout_reward, rollout_turns, grading summary (flags included), "
                   "sandbox, session_drift, policy_versions, final, ...",
    ("routed_experts",): "v2: MoE routing replay, raw `[len(tokens) - 1, layers, top_k]` expert ids (uint8, or uint16 "
                         "above 256 experts; `metadata.routed_experts` has the shape); null when off",
}
# what a PyTorch row (make_torch_dataset) holds instead of the column, where it differs
TORCH: dict[str, str] = {
    "tokens": "int64 tensor",
    "loss_mask": "uint8 tensor",
    "rollout_logprobs": "float32 tensor",
    "metadata": "a dict (the JSON parsed)",
    "routed_experts": "int64 tensor `[len(tokens) - 1, layers, top_k]`; the key is absent when null",
}


def _type(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list\\<{_type(t.value_type)}\\>"
    return {"double": "float64", "float": "float32"}.get(str(t), str(t))


def columns_markdown() -> str:
    """The column table (and the lines that say what it is), from ``SAMPLE_SCHEMA``."""
    described = [c for cols in DESCRIPTIONS for c in cols]
    missing = [n for n in SAMPLE_SCHEMA.names if n not in described]
    unknown = [n for n in described if n not in SAMPLE_SCHEMA.names]
    if missing or unknown:
        raise ValueError(f"farm.trajectory.columns: describe {missing}, drop {unknown} (SAMPLE_SCHEMA changed)")
    lines = [
        f"`SAMPLE_SCHEMA` (`farm.trajectory.schema`), schema **version {SCHEMA_VERSION}**: one row per chain, "
        "`not null` unless marked. The last column is what a PyTorch row "
        "(`make_torch_dataset`, `farm.output.torch_data`) holds instead, where it differs (the other columns are "
        "plain Python values).",
        "",
        "| column | type | torch row | |",
        "|---|---|---|---|",
    ]
    for cols, text in DESCRIPTIONS.items():
        fields = [SAMPLE_SCHEMA.field(c) for c in cols]
        types = {(_type(f.type), f.nullable) for f in fields}
        if len(types) != 1:
            raise ValueError(f"farm.trajectory.columns: {cols} share a row but not a type")
        (kind, nullable), = types
        torch = "; ".join(dict.fromkeys(TORCH[c] for c in cols if c in TORCH))
        names = ", ".join(f"`{c}`" for c in cols)
        lines.append(f"| {names} | {kind}{', nullable' if nullable else ''} | {torch} | {text} |")
    return "\n".join(lines) + "\n"


def render_page(text: str) -> str:
    """``text`` (the page) with the table between its markers made anew."""
    try:
        head, rest = text.split(START + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"{PAGE}: the markers {START!r} ... {END!r} are missing") from None
    return f"{head}{START}\n{columns_markdown()}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else PAGE)
    new = render_page(path.read_text())
    if new != path.read_text():
        path.write_text(new)
        print(f"farm.trajectory.columns: wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
