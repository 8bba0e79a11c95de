"""verl: farm Samples as AgentLoopOutput, checked against the documented field contract
and, where verl imports (CPU, verl and its light deps installed), its pydantic class."""

from __future__ import annotations

import numpy as np
import pytest

from farm.integrations.verl import group_to_agent_loop_outputs, to_agent_loop_output

# verl.experimental.agent_loop.agent_loop.AgentLoopOutput (0.9.1): required and optional fields
REQUIRED = {"prompt_ids", "response_ids", "response_mask", "metrics"}
OPTIONAL = {"response_logprobs", "routed_experts", "multi_modal_data", "reward_score", "num_turns", "extra_fields",
            "mm_processor_kwargs", "mm_processor_output"}  # fmt: skip


def test_outputs_follow_the_agent_loop_contract(groups):
    g = groups[0]  # t0: t0.0 one chain; t0.1 three
    outs = group_to_agent_loop_outputs(g, output_cls=None)
    assert len(outs) == len(g.samples) == 4
    for out, s in zip(outs, g.samples):
        assert REQUIRED <= set(out) <= REQUIRED | OPTIONAL
        assert out["prompt_ids"] + out["response_ids"] == s.tokens.tolist()
        assert len(out["prompt_ids"]) == s.prompt_length
        # multi-turn: model tokens 1, the tool result and template tokens between turns 0
        assert out["response_mask"] == s.loss_mask.tolist() and len(out["response_logprobs"]) == s.response_length
        np.testing.assert_array_equal(np.float32(out["response_logprobs"]), s.rollout_logprobs)
        assert out["reward_score"] == s.reward and out["num_turns"] == 2 * s.num_turns
        extra = out["extra_fields"]
        assert (extra["farm_group_id"], extra["farm_rollout_id"], extra["farm_chain_index"]) == (
            "t0", s.rollout_id, s.chain_index)
        assert extra["farm_group_reward_mean"] == 0.5 and "uid" not in extra
    main = outs[0]["response_mask"]
    assert 0 in main and main[0] == 1 and main[-1] == 1  # call, tool result, answer
    assert len(group_to_agent_loop_outputs(g, chains="main", output_cls=None)) == 2


def test_real_agent_loop_output(groups):
    agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    s = groups[0].samples[0]
    out = to_agent_loop_output(s)  # output_cls="auto": verl's class when it imports
    assert isinstance(out, agent_loop.AgentLoopOutput)
    assert isinstance(out.metrics, agent_loop.AgentLoopMetrics)
    assert out.response_ids == s.response_tokens.tolist() and out.extra_fields["farm_rollout_id"] == s.rollout_id
    if hasattr(out, "as_dict"):  # verl >= 0.9: what its worker stacks into the batch
        d = out.as_dict()
        assert d["prompts"].tolist() == s.tokens[: s.prompt_length].tolist()
        assert d["response_mask"].tolist() == s.loss_mask.tolist()
        assert d["rm_scores"][-1].item() == s.reward and d["rm_scores"][:-1].abs().sum() == 0
