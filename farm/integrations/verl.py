"""verl: farm Samples in the shape of verl's ``AgentLoopOutput``.

verl's agent loop (``verl.experimental.agent_loop.agent_loop``) returns one
``AgentLoopOutput`` per trajectory: ``prompt_ids``, ``response_ids`` (model tokens *and*
tool/template tokens of later turns), ``response_mask`` (1 on model tokens, 0 on the
rest), ``response_logprobs`` (same length), ``reward_score``, ``num_turns`` (chat turns:
user, assistant and tool), ``metrics`` (``AgentLoopMetrics``) and ``extra_fields`` (each
key becomes a non-tensor column of the batch). The worker then left-pads the prompt to
``rollout.prompt_length``, right-pads the response to ``rollout.response_length``, and
puts ``reward_score`` on the last response token (``rm_scores``), so no reward model
runs for it.

A farm Sample already has that layout: ``tokens[:prompt_length]`` is the prompt, the rest
interleaves model output (``loss_mask`` 1) and tool/template tokens (0), and
``rollout_logprobs`` are 0.0 off the mask, as verl's tool agent loop writes them.
``num_turns`` here is verl's count for a chain of k model calls: the user prompt, k
assistant turns and the k - 1 tool turns between them (2k); farm's own count is in
``extra_fields["farm_num_turns"]``.

Every chain of a rollout is its own output, with the same ``farm_group_id`` /
``farm_rollout_id`` and its ``farm_chain_index``. verl groups rows for GRPO by the
batch's ``uid`` column; this module never sets it (verl assigns it per dataset prompt
and checks it on union). When you build a batch from farm groups yourself, set
``uid`` to ``farm_group_id``, and note that verl's group mean then weights a rollout
by its number of chains: ``farm.integrations.rows.rollout_advantages`` counts each once.

verl needs its GPU stack to run; its pydantic classes import on CPU when verl and its
light dependencies are installed, and ``output_cls="auto"`` uses them then.
"""

from __future__ import annotations

from typing import Any, Literal

from farm.integrations.rows import ChainPolicy, rows_of
from farm.output.groups import Group
from farm.trajectory.schema import Sample

# farm columns copied into extra_fields (prefixed: extra_fields share the batch's namespace)
EXTRA_COLUMNS = ("run_id", "task_id", "group_id", "rollout_id", "sample_index", "chain_index", "chain_kind",
                 "group_index", "policy_version_min", "policy_version_max", "status", "finish_reason",
                 "num_turns")  # fmt: skip


def verl_output_cls() -> type | None:
    """verl's ``AgentLoopOutput`` if it imports here, else None (dicts are produced)."""
    try:
        # optional: verl
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    except ImportError:
        return None
    return AgentLoopOutput


def verl_num_turns(sample: Sample) -> int:
    """verl's turn count for a chain of ``num_turns`` model calls: 1 user + k assistant
    + (k - 1) tool turns."""
    return 2 * sample.num_turns if sample.num_turns else 1


def to_agent_loop_output(sample: Sample, *, output_cls: type | None | Literal["auto"] = "auto",
                         extra_fields: dict[str, Any] | None = None) -> Any:
    """One Sample as an ``AgentLoopOutput`` (``output_cls``; None: its field dict)."""
    extra = {f"farm_{k}": getattr(sample, k) for k in EXTRA_COLUMNS}
    extra.update(extra_fields or {})
    fields: dict[str, Any] = {
        "prompt_ids": sample.tokens[: sample.prompt_length].tolist(),
        "response_ids": sample.response_tokens.tolist(),
        "response_mask": sample.loss_mask.astype("int64").tolist(),
        "response_logprobs": sample.rollout_logprobs.astype("float64").tolist(),
        "reward_score": sample.reward,
        "num_turns": verl_num_turns(sample),
        "metrics": {},  # AgentLoopMetrics' defaults: farm's timings are per rollout, in the rollouts table
        "extra_fields": extra,
    }
    cls = verl_output_cls() if output_cls == "auto" else output_cls
    if cls is None:
        return fields
    return cls.model_validate(fields) if hasattr(cls, "model_validate") else cls(**fields)


def group_to_agent_loop_outputs(group: Group, *, chains: ChainPolicy = "all",
                                output_cls: type | None | Literal["auto"] = "auto") -> list[Any]:
    """Every row of ``group`` (all chains by default) as ``AgentLoopOutput``s, in rollout
    then chain order, each with ``extra_fields["farm_group_reward_mean"]``."""
    cls = verl_output_cls() if output_cls == "auto" else output_cls
    common = {"farm_group_reward_mean": group.reward_mean, "farm_group_complete": group.complete}
    return [to_agent_loop_output(s, output_cls=cls, extra_fields=common) for s in rows_of(group, chains)]
