"""The engine's logprobs agree with the trainer's: a model behind the scripted worker
(farm's tiny CPU LM), sessions through the real gateway in each CLI protocol (parallel
tool calls, a retried request, a realign, a weight update mid-session), linearized into
Samples; the trainer recomputes every trained token with the weights of its turn. Any
misalignment of tokens, mask, positions or versions shows up as a large difference."""

from __future__ import annotations

import numpy as np
import pytest
from gateway_helpers import SHELL, Conversation, gateway_env, reply_text, turn

from farm.trajectory.linearize import RolloutInfo, linearize

torch = pytest.importorskip("torch")

from farm.simulator.agreement import ModelsByVersion, logprob_agreement, trained_runs  # noqa: E402
from farm.simulator.lm import LMScorer, new_model, save_model  # noqa: E402

TOL = 1e-4


def inserted_note(protocol: str) -> list[dict]:
    """An assistant note the CLI inserted, then user text: the gateway renders in full and
    mounts; the template drops the earlier <think> blocks, so the prompt realigns."""
    if protocol == "chat":
        return [{"role": "assistant", "content": "(note)"}, {"role": "user", "content": "go on"}]
    if protocol == "anthropic":
        return [{"role": "assistant", "content": [{"type": "text", "text": "(note)"}]},
                {"role": "user", "content": [{"type": "text", "text": "go on"}]}]
    return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "(note)"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]}]


@pytest.fixture
def models(hf_tokenizer, tmp_path) -> ModelsByVersion:
    """Versions 0 and 1: two different sets of weights."""
    return ModelsByVersion({v: str(save_model(new_model(len(hf_tokenizer), seed=v), tmp_path / f"v{v}"))
                            for v in (0, 1)})


async def session_samples(tok, protocol: str, models: ModelsByVersion):
    name, arg = SHELL[protocol]
    conv = Conversation(protocol)
    async with gateway_env(tok) as env:
        env.worker.scorer = LMScorer.from_path(models.paths[0])
        h = env.gw.open_session("s")
        r = await turn(env, conv, h.secret, "s", reply_text("Let me look.", [(name, {arg: "git status"}),
                                                                             (name, {arg: "ls"})], reasoning="Look."))
        conv.echo(r, ["clean", "a.py"])
        r = await turn(env, conv, h.secret, "s", reply_text("", [(name, {arg: "pytest"})], reasoning="Test."))
        conv.echo(r, ["1 failed"])
        async with env.http.post(env.engine_url + "/update_weights_from_disk",
                                 json={"model_path": models.paths[1], "weight_version": "1"}) as resp:
            assert resp.status == 200
        await turn(env, conv, h.secret, "s", reply_text("", [(name, {arg: "cat a.py"})]))
        r = await turn(env, conv, h.secret, "s", reply_text("", [(name, {arg: "cat a.py"})]))  # the CLI re-sent it
        conv.echo(r, ["print(1)"], user_text="Please also check b.py")
        r = await turn(env, conv, h.secret, "s", reply_text("b.py next.", [(name, {arg: "cat b.py"})], reasoning="b."))
        conv.echo(r, ["print(2)"])
        conv.body["messages" if protocol != "responses" else "input"] += inserted_note(protocol)
        await turn(env, conv, h.secret, "s", "All done.")
        tree = await env.gw.close_session("s")
        stats = env.gw.stats("s")
    assert stats.retried == 1 and tree.drift.realigned == 1 and stats.appended >= 3
    return linearize(tree, RolloutInfo(rollout_id="r", reward=1.0))


@pytest.mark.parametrize("protocol", ["anthropic", "responses", "chat"])
async def test_trainer_logprobs_agree_with_the_engine(hf_tokenizer, protocol, models):
    samples = await session_samples(hf_tokenizer, protocol, models)
    assert {v for s in samples for v in s.metadata["policy_versions"]} == {0, 1}
    assert len(samples) >= 3  # the retried attempt and the realigned parent train in their own chains
    agree = logprob_agreement(samples, models)
    assert agree.tokens == sum(int(s.loss_mask.sum()) for s in samples) > 100
    assert agree.max_abs <= TOL, agree

    # What a misaligned pipeline would feed the trainer: each shows up, loudly.
    s = max(samples, key=lambda x: int(x.loss_mask.sum()))
    shifted = s.model_copy(update={"loss_mask": np.roll(s.loss_mask, 1),
                                   "rollout_logprobs": np.roll(s.rollout_logprobs, 1)})
    assert logprob_agreement([shifted], models).max_abs > 1.0  # mask (and its logprobs) one token late
    tokens = s.tokens.copy()
    a, b = trained_runs(s.loss_mask)[0]
    tokens[s.prompt_length + a: s.prompt_length + b] = np.roll(tokens[s.prompt_length + a: s.prompt_length + b], 1)
    assert logprob_agreement([s.model_copy(update={"tokens": tokens})], models).max_abs > 1.0  # tokens off by one
    moved = s.model_copy(update={"prompt_length": s.prompt_length - 1, "response_length": s.response_length + 1,
                                 "loss_mask": np.append(s.loss_mask, 0),
                                 "rollout_logprobs": np.append(s.rollout_logprobs, 0.0)})
    assert logprob_agreement([moved], models).max_abs > 1.0  # prompt_length one short: positions off by one
    assert logprob_agreement(samples, lambda v: models(0)).max_abs > 1.0  # the wrong weights for version 1
    dropped = s.model_copy(update={"tokens": s.tokens[1:], "prompt_length": s.prompt_length - 1})
    assert logprob_agreement([dropped], models).max_abs > 1.0  # the context's first token lost, far from any output
