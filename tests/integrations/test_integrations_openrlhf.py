"""OpenRLHF: farm Samples as an agent executor's result, read back the way OpenRLHF's
SamplesGenerator turns one into an Experience (copied below: it needs vLLM to import)."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from farm.errors import IntegrationError
from farm.integrations.openrlhf import FarmAgentExecutor, action_ranges, group_to_agent_outputs, to_agent_output
from farm.integrations.rows import rows_of


def experience_fields(response: dict, max_len: int = 4096) -> dict:
    """openrlhf.trainer.ppo_utils.samples_generator._process_response_into_experience,
    its token-level part (OpenRLHF 0.11)."""
    sequences = np.asarray(response["observation_tokens"][:max_len])
    action_mask = np.zeros(len(response["observation_tokens"]), dtype=np.int64)
    for start, end in response["action_ranges"]:
        action_mask[start:end] = 1
    action_mask = action_mask[1:max_len]
    logprobs = np.asarray(response["rollout_log_probs"][1:max_len])
    info = {k: float(v) for k, v in response["extra_logs"].items()}  # torch.tensor([value]) each
    return {"sequences": sequences, "action_mask": action_mask, "rollout_log_probs": logprobs, "info": info,
            "reward": response["reward"], "score": response["scores"], "truncated": response["truncated"]}


def test_agent_output_reads_back_as_the_sample(groups):
    for s in rows_of(groups[0]):  # every chain, the multi-turn ones included
        exp = experience_fields(to_agent_output(s))
        assert exp["sequences"].tolist() == s.tokens.tolist()
        # action position i predicts token i + 1: the Sample's mask behind its prompt
        expected = np.concatenate([np.zeros(s.prompt_length - 1, np.int64), s.loss_mask])
        np.testing.assert_array_equal(exp["action_mask"], expected)
        np.testing.assert_array_equal(np.float32(exp["rollout_log_probs"][expected == 1]),
                                      s.rollout_logprobs[s.loss_mask == 1])
        assert exp["reward"] == exp["score"] == s.reward and exp["truncated"] is False
        assert exp["info"]["farm_chain_index"] == s.chain_index
    # runs of the mask: the tool call, then the answer after the tool result
    main = rows_of(groups[0])[0]
    assert len(action_ranges(main)) == 2 and action_ranges(main)[0][0] == main.prompt_length


def test_executor_serves_one_group_per_prompt(groups):
    short = dataclasses.replace(groups[1], group_id="short", samples=groups[1].samples[:1])  # a rollout without Samples
    ex = FarmAgentExecutor([groups[0], short, *groups[1:]])
    try:
        from openrlhf.utils.agent import AgentExecutorBase
    except ImportError:
        pass
    else:
        assert isinstance(ex, AgentExecutorBase)

    async def two_prompts():  # OpenRLHF: n executes per prompt, prompts concurrently
        calls = [ex.execute(prompt=f"p{i // 2}", label="", sampling_params=None, max_length=4096,
                            hf_tokenizer=None, llm_engine=None) for i in range(6)]  # fmt: skip
        return await asyncio.gather(*calls)

    outs = asyncio.run(two_prompts())
    assert [(o["prompt"], o["label"]) for o in outs] == [("p0", ""), ("p0", ""), ("p1", ""), ("p1", ""),
                                                         ("p2", ""), ("p2", "")]  # fmt: skip
    served = [o["extra_logs"]["farm_group_index"] for o in outs]
    assert served == [0, 0, 1, 1, 3, 3]
    assert [o["reward"] for o in outs] == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert ex.dropped_chains == 4 and ex.skipped_groups == ["short"]  # n rows per prompt, or none
    assert len(group_to_agent_outputs(groups[0])) == 2 and len(group_to_agent_outputs(groups[0], chains="all")) == 4

    async def one_more():
        await ex.execute("p", "", None, 4096, None, None)
        await ex.execute("p", "", None, 4096, None, None)
        await ex.execute("p", "", None, 4096, None, None)

    with pytest.raises(IntegrationError, match="no farm group"):
        asyncio.run(one_more())
