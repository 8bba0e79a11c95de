"""A training loop on farm, runnable on a CPU: continuous mode, GRPO updates, weights
pushed back every step, and the engine's logprobs checked against the trainer's.

The model is farm's tiny CPU language model (``farm.simulator.lm``) over the test
tokenizer's vocabulary, and the scripted workers serve the *same* model
(``engine.simulator.model_path``): the policy decides the text of each reply (the oracle
solves the demo tasks; with ``--choice K`` the ``choose`` policy lets the model pick one
of K candidate fixes, and only one resolves the task), the model samples its choices
and scores every token it emits. Each step:

1. take complete groups from ``farm.Farm``;
2. recompute, with the weights each turn was generated with, the logprob of every
   trained token and compare it with the engine's (``train_rollout_logprob_diff``:
   max and mean |difference|; float noise when tokens, mask and positions line up);
3. one clipped GRPO step (group-normalized rewards; importance ratio against the
   engine's logprobs; token-level mean over the batch, so the text a group shares
   cancels out);
4. save the weights and push them to every worker (``Farm.update_weights``): later
   turns carry the new version.

    python examples/train_loop.py --steps 3 --groups 2 --n 2              # oracle: rewards all 1, no learning
    python examples/train_loop.py --choice 4 --steps 30 --groups 4 --n 4  # the model's choice decides the reward
    python examples/train_loop.py --choice 4 --steps 30 --shuffle-rewards # the control: rewards permuted per group

Needs torch (``pip install 'farm[train]'``). Prints one JSON line per step, then
``train_loop: steps=... groups=... max_staleness=... stale_dropped=... stale_aborted=...
version_final=... bound=... train_rollout_logprob_diff=... train_rollout_logprob_diff_mean=...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def grpo_loss(model, groups, clip: float = 0.2, temperature: float = 1.0):
    """Clipped policy-gradient loss over every trained token of every Sample, each with
    its group-normalized reward as advantage, averaged over all trained tokens."""
    import torch

    from farm.simulator.lm import token_logprobs

    terms, tokens = [], 0
    for g in groups:
        std = g.reward_std if g.reward_std > 0 else 1.0
        for s in g.samples:
            trained = np.flatnonzero(s.loss_mask) + s.prompt_length
            if len(trained) == 0:
                continue
            advantage = ((s.reward or 0.0) - g.reward_mean) / std
            logp = token_logprobs(model, s.tokens.astype(np.int64), trained, temperature)
            old = torch.from_numpy(s.rollout_logprobs[trained - s.prompt_length].astype(np.float32))
            ratio = torch.exp(logp - old)
            unclipped, clipped = ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage
            terms.append(-torch.minimum(unclipped, clipped).sum())
            tokens += len(trained)
    return torch.stack(terms).sum() / tokens if terms else None


def shuffle_rewards(groups, rng: np.random.Generator) -> list:
    """The control for learning: each group's rewards permuted among its rollouts, so a
    rollout's reward no longer follows what it did (each chain of a rollout keeps one
    reward; a group's mean and spread stay). A policy trained on these must stay at
    chance: a rise on the real rewards is then the rewards' doing, not the update's."""
    out = []
    for g in groups:
        rows = [r for r in g.rollouts if r["rollout_id"] in {s.rollout_id for s in g.samples}]
        moved = rng.permutation([r["reward"] for r in rows])
        reward = {r["rollout_id"]: float(x) for r, x in zip(rows, moved)}
        out.append(dataclasses.replace(
            g, rollouts=[{**r, "reward": reward.get(r["rollout_id"], r["reward"])} for r in g.rollouts],
            samples=[s.model_copy(update={"reward": reward[s.rollout_id]}) for s in g.samples]))
    return out


def choice_tasks(cfg, out: Path, k: int) -> tuple[list, list[str]]:
    """The demo SWE tasks as a choose-one-of-``k``-fixes family (``farm.simulator.choice_tasks``:
    the gold fix is the last candidate of every task), and the config overrides that run it."""
    from farm.tasks.demo import ensure_demo_set
    from farm.tasks.loaders import load_tasks
    from farm.simulator.choice_tasks import choice_tasks as make, write_choice_tasks

    demo = ensure_demo_set(cfg.tasks.cache_dir)
    swe = [t for t in load_tasks(cfg.tasks.model_copy(update={"path": "demo"})).tasks if t.kind == "swe"]
    tasks = make(swe, k)  # SWE tasks: resolved or not (generic ones give decoys partial credit)
    path = write_choice_tasks(tasks, out / "tasks.jsonl", k)
    return tasks, [f"tasks.path={path}", f"tasks.mirror_dir={demo.mirror_dir}", "engine.policy=choose"]


def choice_base_model(model, tok, tasks, *, iters: int = 60, lr: float = 3e-2):
    """The base model of the choice family, as if instruction-tuned: next-token training on
    the ``choose`` policy's replies (on short generic prompts), the K candidates in turn,
    with a uniform target over the K letters where the model chooses. So it answers a
    choice with one of the letters about equally often and writes the rest as the policy
    does. Which letter is right, only the rewards tell."""
    import torch

    from farm.simulator.choose import LABELS, ChoosePolicy
    from farm.simulator.policy import PolicyRequest
    from farm.simulator.protocol import SamplingParams
    from farm.simulator.lm import token_logprobs

    bash = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    policy, data = ChoosePolicy(tasks), []
    for t in tasks:
        prompt = tok.apply_chat_template([{"role": "system", "content": "You are a coding agent."},
                                          {"role": "user", "content": t.instruction}], tools=[bash],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        reply = policy.respond(PolicyRequest(rid="sft", input_ids=prompt, sampling=SamplingParams(),
                                             decode=lambda ids: tok.decode(list(ids))))
        data.append((len(prompt), prompt + enc(reply.text), reply.choice.options))
    letters = [tok.convert_tokens_to_ids(c) for c in LABELS[: len(data[0][2])]]
    with torch.no_grad():  # the long-range features start out of the picture: habits learnt on short
        for layer in (model.model.mix, model.model.phase):  # prompts hold on 40K-token ones (RL may use them)
            layer.weight.zero_()
            layer.bias.zero_()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for it in range(iters):
        losses = []
        for i, (start, head, options) in enumerate(data):
            token, continuation = options[(i + it) % len(options)]
            ids = head + enc(token) + enc(continuation) + [tok.eos_token_id]
            text = token_logprobs(model, ids, [p for p in range(start, len(ids)) if p != len(head)])
            hidden = model.model(torch.tensor(head)[None]).last_hidden_state[0, -1]
            at_choice = torch.log_softmax(model.lm_head(hidden), dim=-1)[letters].mean()
            losses.append(-(text.sum() + at_choice) / (len(text) + 1))
        opt.zero_grad()
        torch.stack(losses).mean().backward()
        opt.step()
    return model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--out", default=None, help="output directory (default: a fresh temporary one)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=2, help="groups per training step")
    ap.add_argument("--n", type=int, default=2, help="rollouts per group")
    ap.add_argument("--choice", type=int, default=0, metavar="K",
                    help="the choose-one-of-K-fixes task family instead of the config's tasks (0: off)")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--on-stale", default="drop", choices=["keep", "drop", "abort"])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help="model initialisation (and the reward shuffle)")
    ap.add_argument("--shuffle-rewards", action="store_true",
                    help="the control: train on each group's rewards permuted among its rollouts (must not learn)")
    ap.add_argument("--max-logprob-diff", type=float, default=1e-4, help="fail above this train/rollout difference")
    ap.add_argument("--set", action="append", default=[], help="extra config overrides a.b=c")
    args = ap.parse_args(argv)

    import torch

    from farm import Farm
    from farm.config import load_config
    from farm.modeltext.tokenizer import load_tokenizer
    from farm.simulator.agreement import ModelsByVersion, logprob_agreement
    from farm.simulator.lm import new_model, save_model

    out = Path(args.out or tempfile.mkdtemp(prefix="farm-train-")).resolve()
    ckpt = out / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"output.dir={out}", f"rollout.n_samples={args.n}", "stream.epochs=null", "stream.shuffle=true",
        f"stream.max_ahead={args.groups * args.n * 2}", f"stream.max_staleness={args.max_staleness}",
        f"stream.on_stale={args.on_stale}", "run_id=train-loop", *args.set,
    ]  # fmt: skip
    cfg = load_config(args.config, overrides)
    tok = load_tokenizer(cfg.engine.tokenizer, cfg.engine.tokenizer_cache_dir)
    model = new_model(len(tok), seed=args.seed, head_scale=1.0 if args.choice else 4.0,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    if args.choice:
        tasks, more = choice_tasks(cfg, out, args.choice)
        overrides += more
        model = choice_base_model(model, tok, tasks)
    temperature = cfg.gateway.sampling.temperature
    models = ModelsByVersion({0: str(save_model(model, ckpt / "step-0"))})  # version 0: what the workers load
    overrides.append(f"engine.simulator.model_path={models.paths[0]}")
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    shuffler = np.random.default_rng(args.seed)

    groups_total, max_stale, version, step = 0, 0, 0, -1
    diff_max, diff_sum, diff_tokens = 0.0, 0.0, 0
    with Farm(args.config, overrides=overrides) as farm:
        for step in range(args.steps):
            groups = farm.next_groups(args.groups)
            if not groups:
                print(f"step {step}: the farm produced no more groups", file=sys.stderr)
                break
            version = farm.policy_version
            samples = [s for g in groups for s in g.samples]
            lo = [s.policy_version_min for s in samples if s.policy_version_min is not None]
            hi = [s.policy_version_max for s in samples if s.policy_version_max is not None]
            stale = max((version - v for v in lo), default=0)
            max_stale = max(max_stale, stale)
            agree = logprob_agreement(samples, models, temperature)
            diff_max, diff_sum, diff_tokens = (max(diff_max, agree.max_abs), diff_sum + agree.mean_abs * agree.tokens,
                                               diff_tokens + agree.tokens)
            model.train()
            trained_on = shuffle_rewards(groups, shuffler) if args.shuffle_rewards else groups
            loss = grpo_loss(model, trained_on, temperature=temperature)
            if loss is not None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            path = save_model(model, ckpt / f"step-{step + 1}")
            version = farm.update_weights(str(path))
            models.add(version, str(path))
            groups_total += len(groups)
            stats = farm.stats()
            rewards = [r for g in groups for r in g.rewards]
            print(json.dumps({
                "step": step + 1, "groups": len(groups), "samples": len(samples),
                "mean_reward": round(float(np.mean(rewards)), 4) if rewards else None,
                "versions": sorted(set(lo) | set(hi)), "max_staleness": stale,
                "stale_dropped": stats["stale_dropped"] + stats["stale_groups_dropped"],
                "stale_aborted": stats["stale_aborted"], "loss": None if loss is None else round(float(loss.detach()), 4),
                "train_rollout_logprob_diff": agree.max_abs, "train_rollout_logprob_diff_mean": agree.mean_abs,
                "trained_tokens": agree.tokens, "version_now": version, "rewards_shuffled": args.shuffle_rewards,
            }), flush=True)  # fmt: skip
        stats = farm.stats()
    mean = diff_sum / diff_tokens if diff_tokens else 0.0
    print(f"train_loop: steps={step + 1} groups={groups_total} max_staleness={max_stale} "
          f"stale_dropped={stats['stale_dropped'] + stats['stale_groups_dropped']} "
          f"stale_aborted={stats['stale_aborted']} version_final={version} bound={args.max_staleness} "
          f"train_rollout_logprob_diff={diff_max:.3g} train_rollout_logprob_diff_mean={mean:.3g}")
    return 0 if max_stale <= args.max_staleness and diff_tokens and diff_max <= args.max_logprob_diff else 1


if __name__ == "__main__":
    sys.exit(main())
