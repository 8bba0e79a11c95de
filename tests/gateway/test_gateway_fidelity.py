"""Token fidelity: the prompt the engine saw vs a fresh chat-template render, measured at
session close, classified, carried into the Sample's metadata."""

from __future__ import annotations

import numpy as np
from gateway_helpers import Conversation, gateway_env, reply_text, turn

from farm.gateway.fidelity import differing_runs, measure_turn
from farm.gateway.render import PromptRenderer
from farm.trajectory import RolloutInfo, TurnTree, linearize


def test_differing_runs():
    a = np.array([1, 2, 3, 4, 5, 6])
    assert differing_runs(a, a.copy()) == []
    assert differing_runs(a, np.array([1, 2, 9, 4, 5, 6])) == [("replace", 2, 3, 2, 3)]
    assert differing_runs(a, np.array([1, 2, 5, 6])) == [("delete", 2, 4, 2, 2)]


async def test_append_only_prompts_equal_fresh_renders_until_a_think_block_is_dropped(hf_tokenizer):
    """Plain tool-calling turns: the engine's context is exactly the template's render (0
    differing tokens). A reply with reasoning followed by a user message: the template drops
    the think block it renders no more, the engine saw it as generated: counted inside the
    model's output, and carried into the Sample."""
    conv = Conversation("chat")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("f")
        r1 = await turn(env, conv, h.secret, "f", reply_text("", [("bash", {"command": "ls"})]))
        conv.echo(r1, ["a.py"])
        await turn(env, conv, h.secret, "f", reply_text("", [("bash", {"command": "cat a.py"})]))
        clean_tree = await env.gw.close_session("f")
        h = env.gw.open_session("g")
        conv = Conversation("chat")
        r1 = await turn(env, conv, h.secret, "g", reply_text("I look.", [("bash", {"command": "ls"})],
                                                             reasoning="Look first, then act."))  # fmt: skip
        conv.echo(r1, ["a.py"], user_text="go on")
        await turn(env, conv, h.secret, "g", "done")
        think_tree = await env.gw.close_session("g")
    clean = clean_tree.turns[-1].meta["fidelity"]
    assert clean["differing_tokens"] == 0 and clean["seen_tokens"] == clean["fresh_tokens"] > 0
    assert env.gw.stats("g").appended == 1
    fid = think_tree.turns[-1].meta["fidelity"]
    assert fid["model_output"] > 0 and fid["template"] == 0 and fid["tool_result"] == 0
    assert fid["seen_tokens"] - fid["fresh_tokens"] == fid["model_output"]  # the dropped think block
    dropped = hf_tokenizer.decode(fid["runs"][0]["seen"])
    assert "Look first" in dropped
    [sample] = linearize(think_tree, RolloutInfo(rollout_id="r"))
    assert sample.metadata["fidelity"]["model_output"] == fid["model_output"]


def test_a_rewritten_tool_result_is_counted_as_such(hf_tokenizer):
    r = PromptRenderer(hf_tokenizer)
    msgs = [{"role": "user", "content": "run it"},
            {"role": "assistant", "content": "ok", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}]},
            {"role": "tool", "tool_call_id": "c0", "content": "first listing: a.py b.py"}]  # fmt: skip
    seen = r.full_prompt(msgs, [])
    stored = [*msgs[:2], {**msgs[2], "content": "first listing: a.py c.py"}]  # what the tree holds
    t = TurnTree("s")
    t.append(parent_id=None, prompt_delta_ids=seen, output_ids=[5], output_logprobs=[-0.1], finish_reason="stop",
             messages=stored)  # fmt: skip
    fid = measure_turn(t, t.turns[0].turn_id, r, [])
    assert fid["tool_result"] > 0 and fid["model_output"] == 0 and fid["template"] == 0
