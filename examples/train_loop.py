"""A training loop on farm, runnable on a CPU: continuous mode, GRPO-style updates,
weights pushed back every step.

The policy the farm serves here is the scripted oracle engine (no GPU); the model
trained is a tiny random causal LM over the same tokenizer's vocabulary. Each step:
take complete groups from ``farm.Farm``, compute group-normalized advantages, take one
clipped policy-gradient step on the trained tokens of every Sample (importance ratio
against the engine's rollout logprobs), save the weights and push them to every worker
through the router (``Farm.update_weights``). The scripted workers record the version
they serve; every later turn is stamped with it.

    python examples/train_loop.py --steps 3 --groups 2 --n 2

Needs torch (``pip install 'farm[train]'``). Prints one line per step, then
``train_loop: steps=... groups=... max_staleness=... stale_dropped=... version_final=...``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


def build_model(vocab: int, dim: int = 32, width: int = 8):
    """A tiny causal LM: embedding -> causal convolution over the last ``width`` tokens ->
    vocabulary head. Convolutions keep 40K-token agent contexts fast on a CPU (parallel
    over positions, linear in length); the head runs only at trained positions."""
    import torch

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, dim)
            self.conv = torch.nn.Conv1d(dim, dim, kernel_size=width)
            self.head = torch.nn.Linear(dim, vocab)
            self.width = width

        def token_logprobs(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            """log p(tokens[i] | tokens[:i]) for each i in ``positions``."""
            x = self.embed(tokens[:-1]).T[None]  # (1, dim, n-1): position j sees tokens <= j
            x = torch.nn.functional.pad(x, (self.width - 1, 0))  # causal: no look-ahead
            hidden = torch.relu(self.conv(x))[0].T  # (n-1, dim)
            logits = self.head(hidden[positions - 1])
            return torch.log_softmax(logits, dim=-1).gather(1, tokens[positions][:, None])[:, 0]

    return TinyLM()


def grpo_loss(model, groups, clip: float = 0.2):
    """Clipped policy-gradient loss over every trained token of every Sample, with the
    group-normalized reward as each Sample's advantage."""
    import torch

    terms = []
    for g in groups:
        std = g.reward_std if g.reward_std > 0 else 1.0
        for s in g.samples:
            trained = np.flatnonzero(s.loss_mask) + s.prompt_length
            if len(trained) == 0:
                continue
            advantage = ((s.reward or 0.0) - g.reward_mean) / std
            tokens = torch.from_numpy(s.tokens.astype(np.int64))
            positions = torch.from_numpy(trained)
            logp = model.token_logprobs(tokens, positions)
            old = torch.from_numpy(s.rollout_logprobs[trained - s.prompt_length].astype(np.float32))
            ratio = torch.exp(logp - old)
            unclipped, clipped = ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage
            terms.append(-torch.minimum(unclipped, clipped).mean())
    return torch.stack(terms).mean() if terms else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--out", default=None, help="output directory (default: a fresh temporary one)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--groups", type=int, default=2, help="groups per training step")
    ap.add_argument("--n", type=int, default=2, help="rollouts per group")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--on-stale", default="drop", choices=["keep", "drop", "abort"])
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--set", action="append", default=[], help="extra config overrides a.b=c")
    args = ap.parse_args(argv)

    import torch

    from farm import Farm
    from farm.model.tokenizer import resolve_tokenizer

    out = Path(args.out or tempfile.mkdtemp(prefix="farm-train-"))
    overrides = [
        f"output.dir={out}", f"rollout.n_samples={args.n}", "stream.epochs=null", "stream.shuffle=true",
        f"stream.max_ahead={args.groups * args.n * 2}", f"stream.max_staleness={args.max_staleness}",
        f"stream.on_stale={args.on_stale}", "run_id=train-loop", *args.set,
    ]  # fmt: skip
    farm = Farm(args.config, overrides=overrides)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(resolve_tokenizer(farm.cfg.engine.tokenizer,
                                                                farm.cfg.engine.tokenizer_cache_dir)))
    torch.manual_seed(0)
    model = build_model(vocab)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    ckpt = out / "checkpoints"
    ckpt.mkdir(parents=True, exist_ok=True)

    groups_total, max_stale, version = 0, 0, 0
    with farm:
        for step in range(args.steps):
            groups = farm.next_groups(args.groups)
            if not groups:
                print(f"step {step}: the farm produced no more groups", file=sys.stderr)
                break
            version = farm.policy_version
            lo = [s.policy_version_min for g in groups for s in g.samples if s.policy_version_min is not None]
            hi = [s.policy_version_max for g in groups for s in g.samples if s.policy_version_max is not None]
            stale = max((version - v for v in lo), default=0)
            max_stale = max(max_stale, stale)
            loss = grpo_loss(model, groups)
            if loss is not None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            path = ckpt / f"step-{step + 1}.pt"
            torch.save(model.state_dict(), path)
            version = farm.update_weights(str(path))
            groups_total += len(groups)
            stats = farm.stats()
            rewards = [r for g in groups for r in g.rewards]
            print(json.dumps({
                "step": step + 1, "groups": len(groups), "samples": sum(len(g.samples) for g in groups),
                "mean_reward": round(float(np.mean(rewards)), 4) if rewards else None,
                "versions": sorted(set(lo) | set(hi)), "max_staleness": stale,
                "stale_dropped": stats["stale_dropped"] + stats["stale_groups_dropped"],
                "stale_aborted": stats["stale_aborted"], "loss": None if loss is None else round(float(loss.detach()), 4),
                "version_now": version,
            }), flush=True)  # fmt: skip
        stats = farm.stats()
    served = _versions_served(farm)
    print(f"served weight versions (scripted workers): {served}", file=sys.stderr)
    print(f"train_loop: steps={step + 1} groups={groups_total} max_staleness={max_stale} "
          f"stale_dropped={stats['stale_dropped'] + stats['stale_groups_dropped']} "
          f"stale_aborted={stats['stale_aborted']} version_final={version} bound={args.max_staleness}")
    return 0 if max_stale <= args.max_staleness else 1


def _versions_served(farm) -> dict[str, int]:
    """What the scripted workers say they served, by weight version (from their logs dir
    is gone after stop: read from the Samples instead)."""
    from farm.trajectory.output import open_sample_reader
    from farm.trajectory.schema import table_to_samples

    counts: dict[str, int] = {}
    reader = open_sample_reader(farm.out_dir)
    if reader.entries():
        for s in table_to_samples(reader.read_table()):
            for v in s.metadata.get("policy_versions", []):
                counts[str(v)] = counts.get(str(v), 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
