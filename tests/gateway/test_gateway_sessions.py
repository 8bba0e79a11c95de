"""Multi-turn sessions per protocol: append-only prompts, branches, parallel calls, limits, side requests."""

from __future__ import annotations

import copy

import pytest
from gateway_helpers import SHELL, Conversation, check_stream, gateway_env, reply_text, turn

from farm.gateway.anthropic import AnthropicProtocol
from farm.gateway.chat import ChatProtocol
from farm.gateway.responses import ResponsesProtocol
from farm.trajectory.records import FinishReason, TurnFlag

PROTOCOLS = ["anthropic", "responses", "chat"]
PARSERS = {"anthropic": AnthropicProtocol(), "responses": ResponsesProtocol(), "chat": ChatProtocol()}


def _engine_prompts(env, sid: str) -> list[list[int]]:
    return [list(r.input_ids) for r in env.policy.requests if r.routing_key == sid]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_append_only_multi_turn(hf_tokenizer, protocol):
    """Turn k+1's prompt = turn k's prompt + output + delta; identical to a full render."""
    name, arg = SHELL[protocol]
    conv = Conversation(protocol)
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("s")
        plan = [
            reply_text("Let me look around.", [(name, {arg: "git status"}), (name, {arg: "ls"})]),  # parallel
            reply_text("", [(name, {arg: "pytest -q"})]),
            reply_text("Tests pass now.", [(name, {arg: "git diff"})]),
        ]
        for i, text in enumerate(plan):
            reply = await turn(env, conv, h.secret, "s", text)
            calls = conv.calls(reply)
            assert len(calls) == (2 if i == 0 else 1)  # parallel calls reach the CLI as parallel calls
            conv.echo(reply, [f"output {i}.{j}\n" * 3 for j in range(len(calls))])
        final = await turn(env, conv, h.secret, "s", "All done.")
        assert conv.calls(final) == []
        # the whole conversation once more, rendered from scratch: same ids
        canon = PARSERS[protocol].parse(conv.request(), {})
        full = env.gw.renderer.full_prompt(canon.messages, canon.tools)
        tree = await env.gw.close_session("s")
        stats = env.gw.stats("s")

    prompts = _engine_prompts(env, "s")
    turns = tree.turns
    assert len(turns) == 4 and stats.appended == 3 and stats.roots == 1 and stats.full_renders == 0
    for k in range(3):
        assert turns[k + 1].parent_id == turns[k].turn_id
        seq = prompts[k] + list(turns[k].output_ids)
        assert prompts[k + 1][: len(seq)] == seq
        assert len(turns[k + 1].prompt_delta_ids) == len(prompts[k + 1]) - len(seq)
    assert prompts[-1] == full
    assert [len([m for m in t.messages if m["role"] == "tool"]) for t in turns[1:]] == [2, 1, 1]


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_reasoning_is_returned_and_echo_without_it_still_appends(hf_tokenizer, protocol):
    name, arg = SHELL[protocol]
    conv = Conversation(protocol)
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("r")
        reply = await turn(env, conv, h.secret, "r", reply_text("", [(name, {arg: "ls"})], reasoning="Look first."))
        if protocol == "anthropic":
            assert reply["content"][0] == {"type": "thinking", "thinking": "Look first.",
                                           "signature": reply["content"][0]["signature"]}  # fmt: skip
            reply = dict(reply, content=reply["content"][1:])  # strip the thinking block from the echo
        elif protocol == "responses":
            assert reply["output"][0]["content"][0]["text"] == "Look first."
        else:
            assert reply["reasoning"] == "Look first."
        conv.echo(reply, ["a.py"])
        await turn(env, conv, h.secret, "r", "ok")
        assert env.gw.stats("r").appended == 1
        tree = env.gw.tree("r")
        assert tree.turns[0].response["reasoning_content"] == "Look first."


async def test_tolerant_echo_rewritten(hf_tokenizer):
    """Key order, whitespace, re-serialized arguments, rewritten ids, split text blocks."""
    conv = Conversation("anthropic")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("t")
        reply = await turn(env, conv, h.secret, "t", reply_text("I will list  the files.", [("Bash", {"command": "ls", "n": 1})]))
        conv.echo(reply, ["a.py"])
        echo = conv.body["messages"][-2]
        text, use = echo["content"]
        echo["content"] = [
            {"text": "I will list ", "type": "text"},
            {"type": "text", "text": "the files.\n"},
            {"input": {"n": 1, "command": "ls"}, "name": "Bash", "type": "tool_use", "id": use["id"]},
        ]
        await turn(env, conv, h.secret, "t", "ok")
        assert env.gw.stats("t").appended == 1


async def test_rewritten_history_opens_new_branch(hf_tokenizer):
    conv = Conversation("chat")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("b")
        r1 = await turn(env, conv, h.secret, "b", reply_text("", [("bash", {"command": "ls"})]))
        conv.echo(r1, ["a.py"])
        r2 = await turn(env, conv, h.secret, "b", reply_text("", [("bash", {"command": "cat a.py"})]))
        conv.echo(r2, ["print(1)"])
        # the CLI edits what the model said in turn 2 (e.g. a harness rewrite): not our reply any more
        edited = copy.deepcopy(conv)
        edited.body["messages"][-2]["tool_calls"][0]["function"]["arguments"] = '{"command":"cat b.py"}'
        await turn(env, edited, h.secret, "b", "branch")
        # a compaction-like rewrite of the whole history: a new root
        compact = Conversation("chat", task="Summary of the work so far: fixed calc.py")
        await turn(env, compact, h.secret, "b", "after compaction")
        tree = await env.gw.close_session("b")
        stats = env.gw.stats("b")
    t1, t2, t3, t4 = tree.turns
    assert t2.parent_id == t1.turn_id
    assert t3.parent_id == t1.turn_id and TurnFlag.FULL_RENDER in t3.flags  # mounted on turn 1, a sibling of t2
    assert t3.meta["drift"]["kind"] in ("clean", "realign")
    assert t4.parent_id is None
    assert stats.roots == 1 and stats.full_renders == 2  # every rewrite is a counted fallback
    assert stats.fallback_reasons == {"echo_mismatch": 1, "history_changed": 1}
    assert len(tree.leaves()) == 3


async def test_retry_of_same_request_is_a_sibling(hf_tokenizer):
    conv = Conversation("responses")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("y")
        r1 = await turn(env, conv, h.secret, "y", reply_text("", [("exec_command", {"cmd": "ls"})]))
        conv.echo(r1, ["a.py"])
        await turn(env, conv, h.secret, "y", "first try")
        await turn(env, conv, h.secret, "y", "second try")  # the CLI re-sent the same request
        tree = env.gw.tree("y")
        t1, t2, t3 = tree.turns
        assert t2.parent_id == t3.parent_id == t1.turn_id
        assert list(tree.prompt_ids(t2.turn_id)) == list(tree.prompt_ids(t3.turn_id))
        assert env.gw.stats("y").retried == 1


async def test_side_requests_never_join_the_main_chain(hf_tokenizer):
    conv = Conversation("anthropic")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("side")
        r1 = await turn(env, conv, h.secret, "side", reply_text("", [("Bash", {"command": "ls"})]))
        conv.echo(r1, ["a.py"])
        title = {"model": "m", "max_tokens": 100, "stream": True,
                 "messages": [{"role": "user", "content": "Summarize: fix calc.py"}]}  # fmt: skip
        env.script("side", "Fix calc")
        status, out, _ = await env.post("anthropic", title, h.secret)
        assert status == 200 and check_stream("anthropic", out, title)["content"][0]["text"] == "Fix calc"
        await turn(env, conv, h.secret, "side", "done")
        status, out, _ = await env.post("/v1/messages/count_tokens", {"model": "m", "messages": title["messages"]},
                                        h.secret, headers={"x-api-key": h.secret})  # fmt: skip
        assert status == 200 and '"input_tokens"' in out
        tree = await env.gw.close_session("side")
        stats = env.gw.stats("side")
    t1, side, t3 = tree.turns
    assert TurnFlag.SIDE_REQUEST in side.flags and not side.trainable and side.parent_id is None
    assert t3.parent_id == t1.turn_id and t3.trainable
    assert stats.side_requests == 1 and stats.count_tokens == 1 and stats.appended == 1


async def test_sessions_are_isolated(hf_tokenizer):
    async with gateway_env(hf_tokenizer) as env:
        a, b = env.gw.open_session("A"), env.gw.open_session("B")
        ca, cb = Conversation("chat"), Conversation("chat")
        ra = await turn(env, ca, a.secret, "A", reply_text("", [("bash", {"command": "ls"})]))
        ca.echo(ra, ["a.py"])
        # B sends A's continuation: it cannot extend A's turn, it starts its own tree
        env.script("B", "b")
        status, _, _ = await env.post("chat", ca.request(), b.secret)
        assert status == 200
        await turn(env, cb, b.secret, "B", "b2")
        assert len(env.gw.tree("A")) == 1 and len(env.gw.tree("B")) == 2
        assert all(t.parent_id is None for t in env.gw.tree("B").turns)
        assert env.gw.stats("B").appended == 0 and env.gw.stats("A").requests == 1


async def test_non_streaming_replies(hf_tokenizer):
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("ns")
        for protocol in ("anthropic", "responses", "chat"):
            conv = Conversation(protocol, task=f"task for {protocol}")
            body = dict(conv.request(), stream=False)
            name, arg = SHELL[protocol]
            env.script("ns", reply_text("Checking.", [(name, {arg: "ls"}), (name, {arg: "pwd"})]))
            status, out, headers = await env.post(protocol, body, h.secret)
            assert status == 200 and headers["Content-Type"].startswith("application/json")
            import json

            data = json.loads(out)
            if protocol == "anthropic":
                assert [b["type"] for b in data["content"]] == ["text", "tool_use", "tool_use"]
                assert data["stop_reason"] == "tool_use"
            elif protocol == "responses":
                assert [i["type"] for i in data["output"]] == ["message", "function_call", "function_call"]
                assert data["status"] == "completed"
            else:
                msg = data["choices"][0]["message"]
                assert len(msg["tool_calls"]) == 2 and data["choices"][0]["finish_reason"] == "tool_calls"


async def test_sampling_override_and_client_stop_sequences(hf_tokenizer):
    async with gateway_env(hf_tokenizer, sampling={"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 64}) as env:
        h = env.gw.open_session("st")
        body = dict(Conversation("anthropic").request(), temperature=0.0, top_p=0.1, max_tokens=1000,
                    stop_sequences=["STOP"])  # fmt: skip
        env.script("st", "abc STOP def")
        status, out, _ = await env.post("anthropic", body, h.secret)
        msg = check_stream("anthropic", out, body)
        assert msg["stop_reason"] == "stop_sequence" and msg["content"][0]["text"] == "abc "
        sp = env.policy.requests[-1].sampling
        assert (sp.temperature, sp.top_p, sp.max_new_tokens) == (0.7, 0.9, 64)  # the run's, not the CLI's
        assert sp.stop == ["STOP"] and sp.no_stop_trim and not sp.skip_special_tokens
        turn = env.gw.tree("st").turns[0]
        assert turn.finish_reason is FinishReason.STOP and turn.response["content"] == "abc "


async def test_qwen3_coder_format_end_to_end(hf_tokenizer):
    conv = Conversation("chat")
    async with gateway_env(hf_tokenizer, tool_format="qwen3_coder") as env:
        h = env.gw.open_session("q")
        text = reply_text("", [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})], tool_format="qwen3_coder")
        assert "<function=bash>" in text
        reply = await turn(env, conv, h.secret, "q", text)
        assert [(c[1], c[2]) for c in conv.calls(reply)] == [("bash", {"command": "ls"}), ("bash", {"command": "pwd"})]
        conv.echo(reply, ["a.py", "/work"])
        await turn(env, conv, h.secret, "q", "done")
        assert env.gw.stats("q").appended == 1


async def test_turns_carry_the_engine_weight_version(hf_tokenizer):
    """Each turn's policy_version is the weight version the engine replied with."""
    conv = Conversation("chat")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("pv", policy_version=1)
        await turn(env, conv, h.secret, "pv", "before the update")  # worker reports "default"
        async with env.http.post(env.engine_url + "/update_weights_from_disk",
                                 json={"model_path": "/ckpt/step-7", "weight_version": "7"}) as resp:
            assert resp.status == 200, await resp.text()
        conv.echo(await turn(env, conv, h.secret, "pv", "after the update"), [])
        await turn(env, conv, h.secret, "pv", "still after")
        tree = await env.gw.close_session("pv")
    assert [t.policy_version for t in tree.turns] == [1, 7, 7]


async def test_an_assistant_message_among_the_new_ones_is_rendered_in_full(hf_tokenizer):
    """A request that extends the lane but carries an assistant message the model never
    wrote (a note the CLI inserted) is not an append: its tokens are the template's, so it
    is rendered in full and mounted (counted), never spliced in as a delta."""
    conv = Conversation("chat")
    async with gateway_env(hf_tokenizer) as env:
        h = env.gw.open_session("d")
        r1 = await turn(env, conv, h.secret, "d", reply_text("", [("bash", {"command": "ls"})]))
        conv.echo(r1, ["a.py"])
        conv.body["messages"] += [{"role": "assistant", "content": "(a note the CLI inserted)"},
                                  {"role": "user", "content": "go on"}]  # fmt: skip
        await turn(env, conv, h.secret, "d", "ok")
        stats = env.gw.stats("d")
        tree = env.gw.tree("d")
    assert stats.fallback_reasons == {"assistant_in_delta": 1} and stats.appended == 0
    assert TurnFlag.FULL_RENDER in tree.turns[-1].flags



def test_a_retry_of_a_realigned_turn_is_rendered_again(hf_tokenizer):
    """A re-sent request whose turn was realigned (mounted inside its parent's sequence) is
    not spliced as parent sequence + delta: that is not the prompt the turn saw. It is
    rendered in full again (counted as retry_of_realigned_turn)."""
    from farm.gateway.canonical import tools_digest
    from farm.gateway.history import plan_turn
    from farm.gateway.render import PromptRenderer
    from farm.gateway.sessions import Lane, TokenSession
    from farm.trajectory import TurnTree

    tree = TurnTree("s")
    h0 = [{"role": "user", "content": "fix it"}]
    a = tree.mount(prompt_ids=[1, 2], output_ids=[101, 102, 103], output_logprobs=[-0.1] * 3, finish_reason="stop",
                   messages=h0, response={"role": "assistant", "content": "looking"})  # fmt: skip
    hist = h0 + [{"role": "assistant", "content": "looking"}, {"role": "user", "content": "go on"}]
    b = tree.mount(prompt_ids=[1, 2, 101, 99, 102, 103, 5], output_ids=[104], output_logprobs=[-0.2],
                   finish_reason="stop", messages=hist)  # fmt: skip
    assert TurnFlag.DRIFT_REALIGNED in b.flags and b.parent_id == a.turn_id
    session = TokenSession(session_id="s", secret="k", model_name="m", max_turns=9, max_context_tokens=4096,
                      policy_version=None, tree=tree)  # fmt: skip
    lane = Lane(turn_id=b.turn_id, request=hist, response={"role": "assistant", "content": "done"},
                tools_digest=tools_digest([]), generated_end="", sequence_length=b.sequence_length)  # fmt: skip
    session.add_lane(lane, replaces=None, keep=4)
    plan = plan_turn(session, hist, [], PromptRenderer(hf_tokenizer), max_candidates=4)
    assert plan.mode == "full" and plan.fallback_reason == "retry_of_realigned_turn"


async def test_each_gateway_opens_sessions_of_its_own_kind(hf_tokenizer):
    """The engine's gateway opens token-exact sessions (a turn tree, never failed by the engine);
    a hosted endpoint's opens black-box ones (a transcript named after the endpoint, which the
    endpoint can fail): chosen when the session opens, read the same way after."""
    from farm.engine.client import EngineClient
    from farm.gateway.config import GatewayConfig
    from farm.gateway.endpoints import OpenAIEndpoint, RolloutMode
    from farm.gateway.gateway import Gateway
    from farm.gateway.sessions import HostedSession, TokenSession
    from farm.trajectory.transcript import Transcript
    from farm.trajectory.tree import TurnTree

    engine = EngineClient("http://127.0.0.1:9")  # never called: no turn is served here
    token = Gateway(GatewayConfig(), hf_tokenizer, engine)
    hosted = Gateway.for_endpoint(GatewayConfig(), "ep", OpenAIEndpoint(kind="openai", base_url="http://127.0.0.1:9/v1",
                                                                         model="m"), None)  # fmt: skip
    assert (token.mode, hosted.mode) == (RolloutMode.TOKEN_EXACT, RolloutMode.BLACK_BOX)
    for gw, kind, record in ((token, TokenSession, TurnTree), (hosted, HostedSession, Transcript)):
        gw.open_session("r1")
        session = gw.sessions.get("r1")
        assert type(session) is kind and session.mode is gw.mode and type(session.record) is record
        assert gw.tree("r1") is session.record and gw.session_failure("r1") is None
    hosted.sessions.get("r1").transcript.failure = ("auth", "key refused")
    assert hosted.session_failure("r1") == ("auth", "key refused")
    assert hosted.tree("r1").endpoint == "ep"
    for gw in (token, hosted):
        record = gw.tree("r1")
        assert await gw.close_session("r1") is record
        await gw.stop()
    await engine.close()
