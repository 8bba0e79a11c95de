"""MoE routing replay through the gateway: a real scripted worker simulating a MoE in
SGLang's wire format, the real engine client asking for routed experts incrementally,
and every Sample's experts checked token by token against what the engine would route
for that exact sequence (the fake's experts depend on the token, its position, the layer
and the whole prefix: a shift by one position or a stale prefix cannot pass)."""

from __future__ import annotations

import copy

import numpy as np
from gateway_helpers import Conversation, gateway_env, reply_text, turn

from farm.engine.config import EngineClientConfig
from farm.engine.routing import MoEShape, fake_routing
from farm.trajectory.linearize import RolloutInfo, linearize
from farm.trajectory.schema import samples_to_table, table_to_samples, to_slime_dict

MOE = MoEShape(layers=3, top_k=2, experts=16)


def assert_aligned(sample, shape=MOE):
    """Every position's experts are the engine's for this Sample's own tokens."""
    n = len(sample.tokens)
    assert sample.routed_experts is not None and sample.routed_experts.shape == (n - 1, shape.layers, shape.top_k)
    assert sample.metadata["routed_experts"]["unknown_spans"] == []
    expected = fake_routing(sample.tokens.astype(np.int64), 0, n - 1, shape)
    assert np.array_equal(sample.routed_experts.astype(np.int32), expected)


async def test_appended_parallel_retried_and_remounted_turns_all_align(hf_tokenizer):
    client = EngineClientConfig(routed_experts=MOE)
    conv = Conversation("anthropic")
    async with gateway_env(hf_tokenizer, client=client, moe=MOE) as env:
        h = env.gw.open_session("m")
        r1 = await turn(env, conv, h.secret, "m", reply_text("Look.", [("Bash", {"command": "ls"}),
                                                                        ("Bash", {"command": "git status"})]))
        conv.echo(r1, ["a.py", "clean"])  # parallel tool calls answered in one user message
        r2 = await turn(env, conv, h.secret, "m", reply_text("", [("Bash", {"command": "cat a.py"})]))
        conv.echo(r2, ["print(1)"])
        await turn(env, conv, h.secret, "m", "first try")
        await turn(env, conv, h.secret, "m", "second try")  # the CLI retries: a sibling
        edited = copy.deepcopy(conv)  # the CLI rewrites what the model said: a full render, mounted
        edited.body["messages"][-2]["content"][-1]["input"] = {"command": "cat b.py"}
        await turn(env, edited, h.secret, "m", "after the edit")
        tree = await env.gw.close_session("m")
    turns = tree.turns
    appended = [t for t in turns if "full_render" not in {f.value for f in t.flags}]
    assert len(appended) >= 3 and any("full_render" in {f.value for f in t.flags} for t in turns)
    for t in turns[1:]:
        if t in appended:  # incremental: only the positions the parent did not hold
            parent = tree.get(t.parent_id)
            assert t.routed_start == parent.sequence_length - 1
            assert len(t.routed_experts) == t.sequence_length - parent.sequence_length
    full = [t for t in turns if t not in appended]
    assert all(t.routed_start == 0 for t in full)
    moved = sum(t.meta["routed_bytes"] for t in turns)
    refetch = sum(4 * (t.sequence_length - 1) * MOE.per_token * 4 / 3 for t in turns)
    assert moved < refetch
    samples = linearize(tree, RolloutInfo(rollout_id="r"), keep_untrained=True)
    assert len(samples) >= 3
    for s in samples:
        assert_aligned(s)
    # through Arrow and back, and into slime's form
    again = table_to_samples(samples_to_table(samples))
    for a, b in zip(samples, again):
        assert np.array_equal(a.routed_experts, b.routed_experts) and b.routed_experts.dtype == np.uint8
    d = to_slime_dict(samples[0])
    assert d["rollout_routed_experts"].dtype == np.int32
    assert d["rollout_routed_experts"].shape == (len(d["tokens"]) - 1, MOE.layers, MOE.top_k)


async def test_a_misshapen_reply_is_an_engine_error_not_a_silent_drop(hf_tokenizer):
    client = EngineClientConfig(routed_experts=MoEShape(layers=4, top_k=2, experts=16), retries=0)
    conv = Conversation("chat")
    async with gateway_env(hf_tokenizer, client=client, moe=MOE) as env:  # the engine has 3 layers
        h = env.gw.open_session("x")
        env.script("x", "hi")
        status, out, _ = await env.post("chat", conv.request(), h.secret)
        assert status >= 500 and "routed_experts has" in out and "4 layers" in out
        tree = await env.gw.close_session("x")
    assert len(tree.turns) == 0  # nothing recorded


async def test_a_long_payload_is_decoded_off_the_event_loop_and_still_checked(hf_tokenizer, monkeypatch):
    import asyncio

    from farm.engine import client as client_mod
    from farm.engine.client import EngineClient, GenerateRequest
    from farm.simulator import ScriptedPolicy, ScriptedWorker, WorkerSettings, serve_worker

    big = MoEShape(layers=48, top_k=8, experts=128)
    threads = []
    real = asyncio.to_thread

    async def spy(fn, *a, **k):
        threads.append(fn.__name__)
        return await real(fn, *a, **k)

    monkeypatch.setattr(client_mod.asyncio, "to_thread", spy)
    worker = ScriptedWorker(hf_tokenizer, ScriptedPolicy(default="ok"), WorkerSettings(moe=big))
    ids = list(range(10, 1500))  # ~1,500 positions x 384 ids: a ~3 MB reply
    async with serve_worker(worker) as url, EngineClient(url, EngineClientConfig(routed_experts=big)) as engine:
        res = await engine.generate(GenerateRequest(input_ids=ids, sampling_params={"max_new_tokens": 4}, rid="big",
                                                    routed_experts_start_len=0))
    assert threads == ["_parse"] and res.routed_bytes > client_mod.OFF_LOOP_BYTES
    seq = np.asarray(ids + res.output_ids, dtype=np.int64)
    assert np.array_equal(res.routed_experts.astype(np.int32), fake_routing(seq, 0, len(seq) - 1, big))
