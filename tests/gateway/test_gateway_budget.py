"""Budgets end a session as the policy's outcome (farm.gateway.budget), through each protocol:
the CLI gets a normal end of turn (never the length stop its CLI would exit 1 on), the
session remembers which budget ran out, later requests get the same end without the
engine, and what the CLI was told never reaches a Sample's tokens."""

from __future__ import annotations

import pytest
from gateway_helpers import SHELL, Conversation, gateway_env, reply_text, turn

from farm.gateway.budget import STOP_TEXT
from farm.trajectory.linearize import RolloutInfo, linearize
from farm.trajectory.records import Budget, FinishReason, TurnFlag

PROTOCOLS = ["anthropic", "responses", "chat"]
NORMAL_END = {"anthropic": "end_turn", "responses": "completed", "chat": "stop"}


def ending(protocol: str, reply: dict) -> tuple[str, str, int]:
    """(how the reply ends, its final text, tool calls) as the CLI reads them."""
    if protocol == "anthropic":
        text = "".join(b["text"] for b in reply["content"] if b["type"] == "text")
        return reply["stop_reason"], text, sum(b["type"] == "tool_use" for b in reply["content"])
    if protocol == "responses":
        text = "".join(c["text"] for it in reply["output"] if it["type"] == "message" for c in it["content"])
        calls = sum(it["type"] in ("function_call", "custom_tool_call") for it in reply["output"])
        return reply["status"], text, calls
    return reply["finish_reason"], reply["content"], len(reply["tool_calls"])


def _engine_calls(env, sid: str) -> int:
    return sum(1 for r in env.policy.requests if r.routing_key == sid)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_turn_budget_ends_the_session_with_a_normal_end_of_turn(hf_tokenizer, protocol):
    name, arg = SHELL[protocol]
    conv = Conversation(protocol)
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("lim", max_turns=2)
        for i in range(2):
            r = await turn(env, conv, h.secret, "lim", reply_text(f"step {i}", [(name, {arg: "ls"})]))
            conv.echo(r, ["a.py"])
        refused = await turn(env, conv, h.secret, "lim", "never generated")
        how, text, calls = ending(protocol, refused)
        assert how == NORMAL_END[protocol] and calls == 0
        assert text == STOP_TEXT.format(what="the turn budget (max_turns = 2)")
        assert _engine_calls(env, "lim") == 2  # the engine never saw the third request
        # the CLI goes on anyway (a sub-agent's parent, a retry): the same end, no engine, nothing recorded
        conv.echo(refused, [], user_text="please continue")
        again = await turn(env, conv, h.secret, "lim", "never generated either")
        assert ending(protocol, again) == (NORMAL_END[protocol], text, 0)
        tree = await env.gw.close_session("lim")
        stats = env.gw.stats("lim")
    assert _engine_calls(env, "lim") == 2 and len(tree) == 3
    stop = tree.budget_stop
    assert (stop.budget, stop.limit, stop.turns) == (Budget.MAX_TURNS, 2, 2)
    last = tree.turns[-1]
    assert last.flags >= {TurnFlag.TURN_LIMIT, TurnFlag.BUDGET_STOP} and not last.trainable
    assert len(last.output_ids) == 0  # the reply the CLI got is no model output
    assert stats.turn_limit_refusals == 1 and stats.budget_stops == 1 and stats.after_budget_stop == 1
    # the Sample ends with the policy's real last turn, which trains; the refusal is in no Sample
    (sample,) = linearize(tree, RolloutInfo(rollout_id="lim.0", status="truncated"))
    real = tree.turns[1]
    assert list(sample.tokens) == list(tree.sequence_ids(real.turn_id))
    assert int(sample.loss_mask.sum()) == sum(len(t.output_ids) for t in tree.turns[:2])
    assert sample.num_turns == 2 and sample.metadata["final"] and sample.finish_reason == "stop"
    assert "Stopping here" not in hf_tokenizer.decode(list(sample.tokens))


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_output_budget_cut_keeps_the_model_tokens_and_drops_its_tool_calls(hf_tokenizer, protocol):
    name, arg = SHELL[protocol]
    conv = Conversation(protocol)
    async with gateway_env(hf_tokenizer, sampling={"max_new_tokens": 40}) as env:
        h = env.gw.open_session("out")
        call = reply_text("Look.", [(name, {arg: "ls"})])
        rambling = call + " and then I keep going" * 40  # a complete call, then no EOS within the budget
        reply = await turn(env, conv, h.secret, "out", rambling)
        how, text, calls = ending(protocol, reply)
        assert how == NORMAL_END[protocol] and calls == 0 and text.startswith("Look.")
        tree = await env.gw.close_session("out")
    (rec,) = tree.turns
    assert rec.finish_reason is FinishReason.LENGTH and len(rec.output_ids) == 40 and rec.trainable
    assert TurnFlag.BUDGET_STOP in rec.flags and TurnFlag.CONTEXT_LIMIT not in rec.flags
    assert rec.response["tool_calls"]  # the record keeps what the model did; only the CLI's reply differs
    assert (tree.budget_stop.budget, tree.budget_stop.limit, tree.budget_stop.turns) == (Budget.OUTPUT, 40, 1)
    (sample,) = linearize(tree, RolloutInfo(rollout_id="out.0", status="truncated"))
    assert int(sample.loss_mask.sum()) == 40 and list(sample.response_tokens) == list(rec.output_ids)


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_context_window_refuses_or_cuts_and_a_side_request_does_not_end_the_session(hf_tokenizer, protocol):
    conv = Conversation(protocol)
    async with gateway_env(hf_tokenizer) as env:
        probe = env.gw.open_session("probe")
        await turn(env, conv, probe.secret, "probe", "x")
        prompt_len = env.gw.tree("probe").turns[0].prompt_length
        # room for 5 tokens: the output is cut by the context, not the output budget
        cut = env.gw.open_session("cut", max_context_tokens=prompt_len + 5)
        reply = await turn(env, conv, cut.secret, "cut", "word " * 200)
        assert ending(protocol, reply)[0] == NORMAL_END[protocol]
        t = env.gw.tree("cut").turns[0]
        assert len(t.output_ids) == 5 and t.flags >= {TurnFlag.CONTEXT_LIMIT, TurnFlag.BUDGET_STOP} and t.trainable
        stop = env.gw.tree("cut").budget_stop
        assert (stop.budget, stop.limit) == (Budget.CONTEXT, prompt_len + 5)
        # no room at all: refused before the engine
        tiny = env.gw.open_session("tiny", max_context_tokens=10)
        reply = await turn(env, conv, tiny.secret, "tiny", "x")
        how, text, _ = ending(protocol, reply)
        assert how == NORMAL_END[protocol] and text == STOP_TEXT.format(what="the context window (10 tokens)")
        assert not _engine_calls(env, "tiny") and env.gw.tree("tiny").budget_stop.budget is Budget.CONTEXT
        # a side request (a title: no tools where main requests had them) over the window: length, no stop
        side_conv = Conversation(protocol)
        side_conv.body.pop("tools")
        main = env.gw.open_session("side", max_context_tokens=10)
        env.gw.sessions.get("side").seen_tools = True
        reply = await turn(env, side_conv, main.secret, "side", "x")
        assert ending(protocol, reply)[0] != NORMAL_END[protocol]
        assert env.gw.tree("side").budget_stop is None
