"""Group sources (GroupReader, a Farm-like object, iterables) and how a group becomes
rows (all chains, or one row per rollout), on a real output directory."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from farm.integrations.rows import main_row, rollout_advantages, rollouts_of, rows_of
from farm.integrations.source import IterableSource, ReaderSource, as_group_source, iter_groups
from farm.output.groups import GroupReader
from farm.trajectory.schema import Sample

from integ_helpers import COMPLETE


def test_reader_iterable_and_farm_sources(run_dir, groups):
    src = as_group_source(GroupReader(run_dir, order="task"))
    assert isinstance(src, ReaderSource)
    assert [g.group_id for g in src.next_groups(3, timeout=0)] == ["t0", "t1", "t3"]
    assert [g.group_id for g in src.next_groups(3, timeout=0)] == ["t4"]
    assert src.next_groups(3, timeout=0) == []

    src = as_group_source(groups)
    assert isinstance(src, IterableSource)
    assert [g.group_id for g in src.next_groups(2)] == ["t0", "t1"]
    assert [g.group_id for g in iter_groups(src)] == ["t3", "t4"]  # drawn from in order, never re-read

    class FarmLike:  # farm.Farm's method
        def next_groups(self, k, timeout=None):
            return groups[:k]

    farm = FarmLike()
    assert as_group_source(farm) is farm
    assert [g.group_id for g in iter_groups(GroupReader(run_dir), timeout=0)] == COMPLETE
    with pytest.raises(TypeError, match="GroupReader"):
        as_group_source(str(run_dir))
    with pytest.raises(TypeError, match="not a group source"):
        as_group_source(3)


def test_rows_all_chains_and_one_per_rollout(groups):
    g = groups[0]  # t0: t0.0 one chain; t0.1 branch (retry), main, fork (sub-agent)
    assert [(s.rollout_id, s.chain_index) for s in rows_of(g)] == [("t0.0", 0), ("t0.1", 0), ("t0.1", 1), ("t0.1", 2)]
    assert {s.group_id for s in rows_of(g)} == {"t0"}
    # one row per rollout: where the agent ended (t0.1's session ends in a retry of its last request)
    assert [(s.chain_kind, s.metadata["final"]) for s in rows_of(g, "main")] == [("main", True), ("retry", True)]
    with pytest.raises(ValueError):
        rows_of(g, "first")


def test_main_row_trains_what_it_shares_with_a_retry(groups):
    branch, main, fork = rollouts_of(groups[0])[1]
    row = main_row([branch, main, fork])
    # the first turn (tool call) trains in the retry branch, DFS-first; the main chain
    # holds the same tokens in the same context, so its row trains them too (not the
    # retry's own reply, which the main chain does not hold)
    n_root = int(np.flatnonzero(branch.loss_mask == 0)[0])  # the root's output opens the response region
    first = slice(0, n_root)
    assert 0 < n_root < branch.num_trained_tokens
    assert row.num_trained_tokens == main.num_trained_tokens + n_root
    np.testing.assert_array_equal(row.tokens, main.tokens)
    assert row.loss_mask[first].all() and not main.loss_mask[first].any()
    np.testing.assert_array_equal(row.rollout_logprobs[first], branch.rollout_logprobs[first])
    # the main chain's own turn keeps its own mask and logprobs
    own = main.loss_mask == 1
    np.testing.assert_array_equal(row.rollout_logprobs[own], main.rollout_logprobs[own])
    assert row.rollout_logprobs[row.loss_mask == 0].sum() == 0  # still a valid Sample
    assert main_row([main]) is main


def test_advantages_count_each_rollout_once(groups):
    g = groups[2]  # t3: t3.0 (reward 1) has three chains, t3.1 (reward 0) one
    assert [s.rollout_id for s in rows_of(g)] == ["t3.0"] * 3 + ["t3.1"]
    adv = rollout_advantages(g)
    assert adv["t3.0"] == pytest.approx(-adv["t3.1"]) == pytest.approx(0.5 / (np.std([1.0, 0.0], ddof=1) + 1e-6))
    # a row-level baseline would weight t3.0 three times: mean 0.75, not 0.5
    assert rollout_advantages(g, std_normalize=False) == {"t3.0": 0.5, "t3.1": -0.5}
    # output.reward_policy=split: each chain carries a share, the rollout's reward is in metadata
    split = dataclasses.replace(g, samples=[s.model_copy(update={"reward": s.reward / 3}) if s.rollout_id == "t3.0"
                                            else s for s in g.samples])  # fmt: skip
    assert rollout_advantages(split, std_normalize=False) == {"t3.0": 0.5, "t3.1": -0.5}


def test_main_row_keeps_its_own_logprobs_where_both_train():
    """A retry whose reply starts with the same token as the main turn's: the main
    chain trains that token itself and keeps its own logprob."""
    def chain(kind, index, tokens, mask, lps):
        return Sample(rollout_id="r", chain_kind=kind, chain_index=index, tokens=tokens, prompt_length=2,
                      response_length=len(mask), loss_mask=mask, rollout_logprobs=lps)

    branch = chain("branch", 0, [1, 2, 5, 6, 9, 7, 3], [1, 1, 0, 1, 1], [-0.1, -0.2, 0.0, -0.9, -0.8])
    main = chain("main", 1, [1, 2, 5, 6, 9, 7, 8], [0, 0, 0, 1, 1], [0.0, 0.0, 0.0, -0.3, -0.4])
    row = main_row([branch, main])
    assert row.loss_mask.tolist() == [1, 1, 0, 1, 1]
    np.testing.assert_allclose(row.rollout_logprobs, np.float32([-0.1, -0.2, 0.0, -0.3, -0.4]))


def test_advantages_of_groups_of_one_are_zero_and_said_so(groups):
    """rollout.n_samples: 1 (the demo run's): every group-relative advantage is 0, and the
    caller is told once why (GroupsOfOneWarning), not once per group; real groups are quiet."""
    import warnings

    from farm.output.groups import GroupsOfOneWarning

    ones = [dataclasses.replace(g, size=1, rollouts=g.rollouts[:1], samples=[s for s in g.samples if s.sample_index == 0])
            for g in groups]  # fmt: skip
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # Python's own: once per calling line
        advantages = [rollout_advantages(g) for g in ones]
    assert all(set(a.values()) == {0.0} for a in advantages)
    assert [w.category for w in seen] == [GroupsOfOneWarning] and "rollout.n_samples >= 2" in str(seen[0].message)
    assert seen[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error", GroupsOfOneWarning)
        assert any(v != 0 for g in groups for v in rollout_advantages(g).values())  # groups of two: no warning
