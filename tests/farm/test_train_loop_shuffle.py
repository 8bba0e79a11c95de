"""The learning benchmark's control (examples/train_loop.py --shuffle-rewards, run by
scripts/bench_learning.py --shuffle-rewards): each group's rewards are permuted among its
rollouts, every chain of a rollout keeps one reward, the group's rewards stay the same
multiset (its mean and spread: GRPO's baseline), and what a rollout did no longer decides
its reward. Fast: the loop's own function on Groups of real Samples, no farm run."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from farm.output.groups import Group
from farm.trajectory.schema import Sample

ROOT = Path(__file__).resolve().parents[2]


def _train_loop():
    spec = importlib.util.spec_from_file_location("train_loop_example", ROOT / "examples" / "train_loop.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _group(gid: str, rewards: list[float], chains: int = 2) -> Group:
    rows = [{"rollout_id": f"{gid}.{i}", "status": "completed", "reward": r, "sample_index": i}
            for i, r in enumerate(rewards)]  # fmt: skip
    samples = [Sample(rollout_id=f"{gid}.{i}", group_id=gid, sample_index=i, chain_index=c, reward=r,
                      tokens=[1, 2, 3], prompt_length=1, response_length=2, loss_mask=[1, 1], rollout_logprobs=[-1, -1])
               for i, r in enumerate(rewards) for c in range(chains)]  # fmt: skip
    return Group(group_id=gid, task_id=gid, group_index=0, size=len(rewards), rollouts=rows, samples=samples,
                 complete=True)  # fmt: skip


def test_shuffled_rewards_keep_each_groups_rewards_and_lose_who_earned_them():
    shuffle = _train_loop().shuffle_rewards
    groups = [_group("a", [1.0, 0.0, 0.0, 0.0]), _group("b", [0.0, 1.0, 1.0, 0.0])]
    rng = np.random.default_rng(0)
    moved = 0
    for _ in range(50):
        for g, s in zip(groups, shuffle(groups, rng)):
            assert sorted(s.rewards) == sorted(g.rewards) and (s.reward_mean, s.reward_std) == (g.reward_mean, g.reward_std)
            by_rollout = {}
            for sample in s.samples:  # every chain of a rollout: the rollout's (new) reward
                by_rollout.setdefault(sample.rollout_id, set()).add(sample.reward)
            assert by_rollout == {r["rollout_id"]: {r["reward"]} for r in s.rollouts}
            moved += [r["reward"] for r in s.rollouts] != [r["reward"] for r in g.rollouts]
    assert moved > 50  # the rewards left the rollouts that earned them (in most draws)
    assert [r["reward"] for r in groups[0].rollouts] == [1.0, 0.0, 0.0, 0.0]  # the groups themselves untouched
