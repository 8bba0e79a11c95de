"""A model behind the scripted worker (farm's tiny CPU LM, ``--model``): every emitted
token's logprob is the model's given the exact prompt ids, choices are sampled from it,
weight updates load real weights and replies carry the version they were computed with."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from farm.engine.config import LatencyConfig
from farm.simulator import ScriptedPolicy
from farm.simulator.policy import Choice, PolicyReply

torch = pytest.importorskip("torch")

from farm.simulator.lm import LMScorer, load_model, new_model, save_model, token_logprobs  # noqa: E402
from testkit.waits import async_wait_until

REPLY = "Let me check the file first. Then I will fix the bug."


@pytest.fixture
def checkpoints(hf_tokenizer, tmp_path):
    """Two different sets of weights over the test tokenizer: (path v0, path v1)."""
    return tuple(str(save_model(new_model(len(hf_tokenizer), seed=s), tmp_path / f"m{s}")) for s in (0, 1))


def prompt_ids(tok, text: str = "Fix the bug please.") -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False)


async def generate(http, url, body):
    async with http.post(url + "/generate", json={"return_logprob": True, **body}) as r:
        return r.status, await r.json()


def model_logprobs(path: str, prompt: list[int], out: list[int], temperature: float = 1.0) -> np.ndarray:
    with torch.inference_mode():
        return token_logprobs(load_model(path), prompt + out, range(len(prompt), len(prompt) + len(out)),
                              temperature).numpy()


def reply_logprobs(out: dict) -> np.ndarray:
    return np.array([t[0] for t in out["meta_info"]["output_token_logprobs"]])


async def test_logprobs_are_the_models_and_weight_updates_load_for_real(make_worker, http, hf_tokenizer,
                                                                        checkpoints):
    v0, v1 = checkpoints
    worker, url = await make_worker(ScriptedPolicy(default=REPLY), scorer=LMScorer.from_path(v0))
    ids = prompt_ids(hf_tokenizer)
    status, out = await generate(http, url, {"input_ids": ids})
    assert status == 200 and out["meta_info"]["weight_version"] == "default"
    assert out["output_ids"][:-1] == hf_tokenizer.encode(REPLY, add_special_tokens=False)
    np.testing.assert_allclose(reply_logprobs(out), model_logprobs(v0, ids, out["output_ids"]), atol=1e-6)
    # a hotter temperature: SGLang's logprobs of logits / T
    _, hot = await generate(http, url, {"input_ids": ids, "sampling_params": {"temperature": 2.0}})
    np.testing.assert_allclose(reply_logprobs(hot), model_logprobs(v0, ids, out["output_ids"], 2.0), atol=1e-6)

    async with http.post(url + "/update_weights_from_disk", json={"model_path": v1, "weight_version": "1"}) as r:
        assert r.status == 200 and (await r.json())["success"] is True
    _, new = await generate(http, url, {"input_ids": ids})
    assert new["meta_info"]["weight_version"] == "1" and new["output_ids"] == out["output_ids"]
    np.testing.assert_allclose(reply_logprobs(new), model_logprobs(v1, ids, out["output_ids"]), atol=1e-6)
    assert np.abs(reply_logprobs(new) - reply_logprobs(out)).max() > 0.1  # other weights, other logprobs

    # a checkpoint that does not load: refused, the served weights and version stay
    async with http.post(url + "/update_weights_from_disk", json={"model_path": v1 + "-missing",
                                                                  "weight_version": "2"}) as r:
        assert r.status == 400 and "Failed to load weights" in (await r.json())["message"]
    _, same = await generate(http, url, {"input_ids": ids})
    assert same["meta_info"]["weight_version"] == "1"
    np.testing.assert_array_equal(reply_logprobs(same), reply_logprobs(new))
    # token ids the model cannot embed: SGLang's 400
    status, err = await generate(http, url, {"input_ids": [*ids, len(hf_tokenizer) + 10]})
    assert status == 400 and "outside the model's vocabulary" in err["message"]


def pick(prefix: str = "I apply candidate [") -> PolicyReply:
    return PolicyReply(text=prefix, choice=Choice(options=(("A", "] first."), ("B", "] second.")),
                                                   otherwise="] neither."))


async def test_the_model_samples_the_choice(make_worker, http, hf_tokenizer, tmp_path):
    model = new_model(len(hf_tokenizer), seed=0, head_scale=0.0)  # logits = the head's bias, in any context
    a, b = hf_tokenizer.convert_tokens_to_ids(["A", "B"])
    with torch.no_grad():
        model.lm_head.bias[[a, b]] = 20.0  # almost all mass on A and B, equally
    path = str(save_model(model, tmp_path / "ab"))
    worker, url = await make_worker(ScriptedPolicy(default=lambda req: pick()), scorer=LMScorer.from_path(path))
    ids = prompt_ids(hf_tokenizer)
    texts = Counter()
    for _ in range(40):
        _, out = await generate(http, url, {"input_ids": ids, "sampling_params": {"skip_special_tokens": True}})
        texts[out["text"]] += 1
        np.testing.assert_allclose(reply_logprobs(out), model_logprobs(path, ids, out["output_ids"]), atol=1e-6)
        choice_at = len(hf_tokenizer.encode("I apply candidate [", add_special_tokens=False))
        assert out["output_ids"][choice_at] in (a, b) and reply_logprobs(out)[choice_at] > np.log(0.45)
    assert set(texts) == {"I apply candidate [A] first.", "I apply candidate [B] second."}  # both, 40 draws
    # SGLang's sampling_seed makes the draw reproducible; greedy takes the argmax
    seeded = [(await generate(http, url, {"input_ids": ids, "sampling_params": {"sampling_seed": 7}}))[1]["text"]
              for _ in range(3)]
    assert len(set(seeded)) == 1
    with torch.no_grad():
        model.lm_head.bias[b] += 1.0
    save_model(model, tmp_path / "b")
    async with http.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "b")}) as r:
        assert r.status == 200
    _, greedy = await generate(http, url, {"input_ids": ids, "sampling_params": {"temperature": 0.0}})
    assert greedy["text"] == "I apply candidate [B] second."


async def test_without_a_model_a_choice_is_uniform_and_a_bad_option_is_an_error(make_worker, http, hf_tokenizer):
    _, url = await make_worker(ScriptedPolicy(default=lambda req: pick()))
    ids = prompt_ids(hf_tokenizer)
    texts = {(await generate(http, url, {"input_ids": ids}))[1]["text"] for _ in range(30)}
    assert texts == {"I apply candidate [A] first.", "I apply candidate [B] second."}
    bad = PolicyReply(text="x", choice=Choice(options=(("candidate", "!"),)))
    _, url = await make_worker(ScriptedPolicy(default=lambda req: bad))
    status, err = await generate(http, url, {"input_ids": ids})
    assert status == 500 and "single tokens" in err["message"]


async def test_a_request_paused_across_a_weight_update_is_rescored(make_worker, http, hf_tokenizer, checkpoints):
    """SGLang's retract: the request resumes on the new weights; every logprob of its
    reply is the new model's and the reply carries the new version."""
    v0, v1 = checkpoints
    worker, url = await make_worker(ScriptedPolicy(default=REPLY), scorer=LMScorer.from_path(v0),
                                    latency=LatencyConfig(ttft_s=2.0))
    ids = prompt_ids(hf_tokenizer)
    pending = asyncio.ensure_future(generate(http, url, {"input_ids": ids}))
    await async_wait_until(lambda: worker.inflight, timeout_s=10, what="the request in flight")
    await asyncio.sleep(0.2)  # scored on v0 (milliseconds), now waiting for its first token (2 s)
    async with http.post(url + "/pause_generation", json={"mode": "retract"}) as r:
        assert r.status == 200
    async with http.post(url + "/update_weights_from_disk", json={"model_path": v1, "weight_version": "1"}) as r:
        assert r.status == 200
    async with http.post(url + "/continue_generation", json={}) as r:
        assert r.status == 200
    _, out = await asyncio.wait_for(pending, 60)
    assert out["meta_info"]["finish_reason"]["type"] == "stop" and out["meta_info"]["weight_version"] == "1"
    np.testing.assert_allclose(reply_logprobs(out), model_logprobs(v1, ids, out["output_ids"]), atol=1e-6)
    assert worker.stats.rescored == 1


def test_an_unusable_model_is_a_clear_error(tok_path, tmp_path, capsys):
    from farm.cli import main
    from farm.simulator.run import build_worker
    from farm.simulator.server import WorkerSettings

    code = main(["engine", "serve", "--policy", "noop", "--tokenizer", tok_path, "--port", "0",
                 "--model", str(tmp_path / "missing")])  # fmt: skip
    assert code == 2 and "is not a farm tiny-LM checkpoint" in capsys.readouterr().err
    small = LMScorer(new_model(100), "small")  # fewer embeddings than the tokenizer has tokens
    with pytest.raises(ValueError, match="has 100 embeddings"):
        build_worker(policy="noop", tokenizer=tok_path, settings=WorkerSettings(), scorer=small)


async def test_without_a_pause_a_reply_keeps_the_version_it_was_computed_with(make_worker, http, hf_tokenizer,
                                                                             checkpoints):
    """weight_update_pause: none: the weights change under a request in flight; its reply
    was computed with the old ones and says so (version and logprobs agree)."""
    v0, v1 = checkpoints
    worker, url = await make_worker(ScriptedPolicy(default=REPLY), scorer=LMScorer.from_path(v0),
                                    latency=LatencyConfig(ttft_s=2.0))
    ids = prompt_ids(hf_tokenizer)
    pending = asyncio.ensure_future(generate(http, url, {"input_ids": ids}))
    await async_wait_until(lambda: worker.inflight, timeout_s=10, what="the request in flight")
    await asyncio.sleep(0.2)  # scored on v0, waiting for its first token
    async with http.post(url + "/update_weights_from_disk", json={"model_path": v1, "weight_version": "1"}) as r:
        assert r.status == 200
    _, out = await asyncio.wait_for(pending, 60)
    assert out["meta_info"]["weight_version"] == "default" and worker.weight_version == "1"
    np.testing.assert_allclose(reply_logprobs(out), model_logprobs(v0, ids, out["output_ids"]), atol=1e-6)
    assert worker.stats.rescored == 0 and worker.stats.versions_served == {"default": 1}
