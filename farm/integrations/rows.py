"""How a group becomes a trainer's rows: which chains, which ids, which advantage.

A farm rollout may have several Samples (chains: the main conversation, retries that
branch from it, sub-agents and compaction restarts that fork a new root). All of them
share the rollout's ``group_id``, ``rollout_id`` and reward, and differ in
``chain_index``; every model token trains in exactly one of them. Trainers differ in
what they can take:

- ``chains="all"``: every chain is a row (slime, verl, the PyTorch datasets). The group
  then has more rows than rollouts, so a group baseline must count each *rollout* once
  (``rollout_advantages``), not each row.
- ``chains="main"``: one row per rollout, its main chain (TRL and OpenRLHF normalize
  rewards over a fixed number of consecutive rows per prompt), training every model
  token it holds (``main_row``: turns it shares with a retry branch included). Tokens
  only the other chains hold (a retry's own reply, a sub-agent) are not trained there;
  ``dropped_chains`` counts those chains.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np
import xxhash

from farm.output.groups import GROUPS_OF_ONE, Group, GroupsOfOneWarning
from farm.trajectory.schema import Sample

ChainPolicy = Literal["all", "main"]


def rollouts_of(group: Group) -> list[list[Sample]]:
    """The group's Samples per rollout (by sample index), each by chain index; rollouts
    without Samples (no trainable outcome, or nothing to train) are left out."""
    by_index: dict[int, list[Sample]] = {}
    for s in group.samples:
        by_index.setdefault(s.sample_index, []).append(s)
    return [sorted(by_index[i], key=lambda s: s.chain_index) for i in sorted(by_index)]


def main_sample(chains: list[Sample]) -> Sample:
    """The rollout's main chain; if linearization dropped it (nothing left to train in
    it), the chain that trains the most tokens (earliest on a tie)."""
    for s in chains:  # where the agent ended (a session whose last turn was a retry ends in a retry chain)
        if s.metadata.get("final") or s.chain_kind == "main":
            return s
    return max(chains, key=lambda s: (s.num_trained_tokens, -s.chain_index))


def main_row(chains: list[Sample]) -> Sample:
    """``main_sample`` training every model token it holds: a turn shared with another
    chain trains only in one of them (the first in DFS order, often a retry branch), so
    where another chain has the same tokens at the same positions (a shared prefix: the
    same context), its mask and logprobs are folded into the main chain's. Used where
    the other chains are not trained at all (one row per rollout)."""
    main = main_sample(chains)
    mask, logprobs = main.loss_mask.copy(), main.rollout_logprobs.copy()
    p = main.prompt_length
    for other in chains:
        if other is main or not other.num_trained_tokens:
            continue
        n = min(len(main.tokens), len(other.tokens))
        diff = np.flatnonzero(main.tokens[:n] != other.tokens[:n])
        shared = int(diff[0]) if len(diff) else n  # common prefix
        lo = max(p, other.prompt_length)
        if shared <= lo:
            continue
        mine, q = slice(lo - p, shared - p), slice(lo - other.prompt_length, shared - other.prompt_length)
        # only where the main chain does not train the token itself (its own logprob wins)
        theirs = (other.loss_mask[q] == 1) & (mask[mine] == 0)
        mask[mine][theirs] = 1
        logprobs[mine][theirs] = other.rollout_logprobs[q][theirs]
    if np.array_equal(mask, main.loss_mask):
        return main
    return main.model_copy(update={"loss_mask": mask, "rollout_logprobs": logprobs})


def rows_of(group: Group, chains: ChainPolicy = "all") -> list[Sample]:
    """The Samples a trainer gets for ``group``, in rollout then chain order."""
    if chains not in ("all", "main"):
        raise ValueError(f"chains must be 'all' or 'main', not {chains!r}")
    per_rollout = rollouts_of(group)
    if chains == "main":
        return [main_row(c) for c in per_rollout]
    return [s for c in per_rollout for s in c]


def dropped_chains(group: Group, chains: ChainPolicy) -> int:
    """How many of the group's Samples ``rows_of(group, chains)`` leaves out."""
    return len(group.samples) - len(rows_of(group, chains))


def rollout_rewards(group: Group) -> dict[str, float]:
    """One reward per rollout that has Samples: the rollout's own (``metadata.rollout_reward``;
    with ``output.reward_policy=split`` each chain's ``reward`` is only a share of it)."""
    out: dict[str, float] = {}
    for chains in rollouts_of(group):
        r = chains[0].metadata.get("rollout_reward")
        r = chains[0].reward if r is None else r
        out[chains[0].rollout_id] = float(r) if r is not None else 0.0
    return out


def rollout_advantages(group: Group, *, std_normalize: bool = True, eps: float = 1e-6) -> dict[str, float]:
    """GRPO's group-relative advantage per rollout: (reward - group mean) / (std + eps),
    over the group's rollouts, each counted once whatever its number of chains (a
    row-level mean would weight a rollout with three chains three times). A group of one
    rollout (``rollout.n_samples: 1``) gives 0: said once per calling line
    (``GroupsOfOneWarning``)."""
    rewards = rollout_rewards(group)
    if not rewards:
        return {}
    if len(rewards) == 1 and group.size == 1:  # a group of one by design (an incomplete one is the caller's)
        warnings.warn(GROUPS_OF_ONE, GroupsOfOneWarning, stacklevel=2)
    values = np.asarray(list(rewards.values()), dtype=np.float64)
    mean = values.mean()
    # the unbiased std, as slime's (torch.std) and TRL's group normalizers use
    std = values.std(ddof=1) if len(values) > 1 else 0.0
    scale = (std + eps) if std_normalize else 1.0
    return {rid: float((r - mean) / scale) for rid, r in rewards.items()}


def rollout_key(rollout_id: str) -> int:
    """A stable non-negative int64 per rollout id, for trainers whose rollout ids are ints
    (slime's ``Sample.rollout_id``): every chain of a rollout gets the same one."""
    return xxhash.xxh3_64_intdigest(rollout_id.encode()) >> 1
