"""TRL: GRPOTrainer (real, CPU, a tiny random model) trains on farm groups through
FarmRolloutFunc, and what it computes with comes from farm's Samples."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from farm.errors import IntegrationError
from farm.integrations.rows import main_row, rollouts_of
from farm.integrations.trl import FarmRolloutFunc, farm_reward, prompt_dataset
from farm.output.groups import GroupReader

trl = pytest.importorskip("trl")
torch = pytest.importorskip("torch")


def _tiny_model(tok):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)  # fmt: skip
    return LlamaForCausalLM(cfg)


def test_grpo_trainer_trains_on_farm_groups(run_dir, hf_tokenizer, tmp_path, monkeypatch):
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    seen: dict[str, list] = {"reward_kwargs": [], "outputs": []}

    def reward(prompts, completions, completion_ids, farm_reward, farm_rollout_id, **kw):
        seen["reward_kwargs"].append({"completion_ids": completion_ids, "farm_reward": farm_reward,
                                      "farm_rollout_id": farm_rollout_id})  # fmt: skip
        return [float(r) for r in farm_reward]

    class Recording(GRPOTrainer):  # keeps what the trainer computed from each batch
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            seen["outputs"].append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()})
            return out

    rollout_func = FarmRolloutFunc(GroupReader(run_dir, order="task"), timeout=0)
    args = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, num_generations=2, max_steps=2,
        learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no", beta=0.0, seed=0,
        dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    model = _tiny_model(hf_tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Recording(model=model, reward_funcs=reward, args=args, train_dataset=prompt_dataset(8),
                        processing_class=hf_tokenizer, rollout_func=rollout_func)  # fmt: skip
    trainer.train()

    # two steps, two groups of two rollouts each: the four complete groups in task order
    assert rollout_func.groups_used == 4 and len(seen["outputs"]) == 2
    groups = {g.group_id: g for g in GroupReader(run_dir, order="task").read()}
    rows = [main_row(c) for gid in ("t0", "t1", "t3", "t4") for c in rollouts_of(groups[gid])]
    ids = [rid for kw in seen["reward_kwargs"] for rid in kw["farm_rollout_id"]]
    assert ids == [s.rollout_id for s in rows]
    assert [r for kw in seen["reward_kwargs"] for r in kw["farm_reward"]] == [s.reward for s in rows]
    assert rollout_func.dropped_chains == 4  # t0.1 and t3.0: branch and fork chains
    for batch, out in enumerate(seen["outputs"]):
        for i, s in enumerate(rows[4 * batch : 4 * batch + 4]):
            p, r = s.prompt_length, s.response_length
            prompt = out["prompt_ids"][i][out["prompt_mask"][i] == 1]  # left-padded
            assert prompt.tolist() == s.tokens[:p].tolist()
            assert out["completion_ids"][i][:r].tolist() == s.response_tokens.tolist()
            # farm's loss mask is TRL's tool mask; its logprobs are the sampling logprobs
            assert out["tool_mask"][i][:r].tolist() == s.loss_mask.tolist()
            np.testing.assert_array_equal(out["sampling_per_token_logps"][i][:r].numpy(), s.rollout_logprobs)
        # GRPO's group-normalized advantages from farm's rewards: (1, 0) -> (+, -)
        adv = out["advantages"].view(-1, 2)
        rewards = torch.tensor([s.reward for s in rows[4 * batch : 4 * batch + 4]]).view(-1, 2)
        assert torch.equal(torch.sign(adv), torch.sign(rewards - rewards.mean(dim=1, keepdim=True)))
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())  # it trained


def test_trainers_old_logprobs_agree_with_farms(hf_tokenizer, tmp_path, monkeypatch):
    """The trainer's own recomputation (GRPOTrainer's old per-token logps of each
    completion, its fused LM head) against farm's rollout logprobs, on Samples the
    scripted worker served with the same weights (farm's tiny CPU LM, a transformers
    model TRL trains as is): the difference TRL reports as sampling_logp_difference,
    over every trained token of the first generation batch (before any update)."""
    from integ_helpers import build_model_run
    from trl import GRPOConfig, GRPOTrainer

    from farm.simulator.lm import load_model, new_model, save_model

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    path = str(save_model(new_model(len(hf_tokenizer), seed=5, pad_token_id=hf_tokenizer.pad_token_id,
                                    eos_token_id=hf_tokenizer.eos_token_id), tmp_path / "v0"))
    run = build_model_run(tmp_path / "run", hf_tokenizer, path)
    outputs = []

    class Recording(GRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            outputs.append({k: v.detach().clone() if torch.is_tensor(v) else v for k, v in out.items()})
            return out

    # num_iterations=2: TRL computes old_per_token_logps at generation time (before the update)
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, per_device_train_batch_size=4, num_generations=2,
        max_steps=1, num_iterations=2, learning_rate=1e-2, logging_steps=1, report_to=[], save_strategy="no",
        gradient_checkpointing=False, bf16=False,  # float32 like the engine (TRL autocasts to bf16 by default: ~1e-2 off)
        beta=0.0, seed=0, dataloader_num_workers=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = Recording(model=load_model(path), reward_funcs=farm_reward, args=args, train_dataset=prompt_dataset(8),
                        processing_class=hf_tokenizer,
                        rollout_func=FarmRolloutFunc(GroupReader(run, order="task"), timeout=0))  # fmt: skip
    trainer.train()
    out = outputs[0]
    mask = (out["completion_mask"] * out["tool_mask"]).bool()
    delta = (out["old_per_token_logps"] - out["sampling_per_token_logps"]).abs()[mask]
    assert delta.numel() == sum(int(s.loss_mask.sum()) for g in GroupReader(run, order="task").read()
                                for s in g.samples) > 20  # every trained token of both groups
    assert float(delta.max()) <= 1e-4, float(delta.max())
    # and the check is sharp: TRL with other weights disagrees by far more
    other = load_model(str(save_model(new_model(len(hf_tokenizer), seed=6), tmp_path / "v1")))
    with torch.no_grad():
        ids, am = torch.cat([out["prompt_ids"], out["completion_ids"]], 1), torch.cat([out["prompt_mask"],
                                                                                     out["completion_mask"]], 1)
        n = out["completion_ids"].shape[1]
        logits = other(ids, am).logits[:, -n - 1:-1]
        theirs = torch.log_softmax(logits, -1).gather(2, out["completion_ids"][..., None])[..., 0]
    assert float((theirs - out["sampling_per_token_logps"]).abs()[mask].max()) > 1.0


def test_rollout_func_contract_and_errors(run_dir):
    class Trainer:  # what FarmRolloutFunc reads of a GRPOTrainer
        num_generations, num_generations_eval = 2, 2
        accelerator = None

        class model:
            training = True

    groups = GroupReader(run_dir, order="task").read()
    short = dataclasses.replace(groups[1], group_id="short", samples=groups[1].samples[:1])  # a rollout without Samples
    fn = FarmRolloutFunc([groups[0], short, *groups[1:]])
    out = fn(["p"] * 4, Trainer())
    assert set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask", "farm_reward"}
    assert all(len(v) == 4 for v in out.values())
    for ids, mask, lps in zip(out["completion_ids"], out["env_mask"], out["logprobs"]):
        assert len(ids) == len(mask) == len(lps)
    assert farm_reward(farm_reward=out["farm_reward"]) == [1.0, 0.0, 0.0, 1.0]
    assert fn.skipped_groups == ["short"]  # TRL needs num_generations rows per group
    with pytest.raises(IntegrationError, match="multiple of num_generations"):
        fn(["p"] * 3, Trainer())
    fn(["p"] * 4, Trainer())  # t3, t4
    with pytest.raises(IntegrationError, match="source exhausted"):
        fn(["p"] * 2, Trainer())


def test_two_processes_share_a_run_without_overlap(run_dir):
    def trainer(index):
        class T:
            num_generations, num_generations_eval = 2, 2

            class accelerator:
                process_index, num_processes = index, 2

            class model:
                training = True

        return T()

    taken = []
    for index in (0, 1):
        fn = FarmRolloutFunc(GroupReader(run_dir, order="task"), timeout=0)
        while True:
            try:
                taken += fn(["p"] * 2, trainer(index))["farm_group_id"]
            except IntegrationError:
                break
    assert sorted(taken) == sorted(["t0", "t0", "t1", "t1", "t3", "t3", "t4", "t4"])
