"""slime: the rollout function's contract (signature, return shape, Sample fields), with
a faithful copy of slime's ``Sample`` dataclass and of the checks its RolloutManager
runs on a rollout function's output (slime itself needs Megatron and SGLang)."""

from __future__ import annotations

import itertools
import sys
import types
from argparse import Namespace
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import pytest

from farm.errors import IntegrationError
from farm.integrations.rows import rollout_key
from farm.integrations.slime import SlimeRollout, generate_rollout, reward_post_process
from farm.output.groups import GroupsOfOneWarning
from farm.output.groups import GroupReader


@dataclass
class SlimeSample:
    """slime.utils.types.Sample (THUDM/slime main), the fields and from_dict it has."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    rollout_routed_experts: list[list[int]] | None = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    train_metadata: dict | None = None
    session_id: str | None = None
    non_generation_time: float = 0.0

    @staticmethod
    def from_dict(data: dict):
        data = dict(data)
        data["status"] = SlimeSample.Status(data["status"])
        names = set(SlimeSample.__dataclass_fields__)
        sample = SlimeSample(**{k: v for k, v in data.items() if k in names})
        for k, v in data.items():
            if k not in names:
                setattr(sample, k, v)
        return sample


def validate_rollout_id_annotated(node, depth=0):
    """slime.observability.rollout_data_utils.validate_rollout_id_annotated."""
    if isinstance(node, SlimeSample):
        return
    assert isinstance(node, list)
    if node and isinstance(node[0], SlimeSample):
        if depth >= 2 and len(node) > 1:
            rids = [s.rollout_id for s in node]
            assert None not in rids and len(set(rids)) == 1
        return
    for item in node:
        validate_rollout_id_annotated(item, depth + 1)


def slime_train_data(data: list) -> dict[str, list]:
    """What slime's RolloutManager does with a rollout function's samples: validate,
    flatten every level, check each Sample, build the per-rollout loss denominators."""
    validate_rollout_id_annotated(data)
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    for s in data:
        assert len(s.loss_mask) == s.response_length == len(s.rollout_log_probs)
        assert s.response_length <= len(s.tokens)
    sums: dict[int, int] = {}
    for s in data:
        sums[s.rollout_id] = sums.get(s.rollout_id, 0) + sum(s.loss_mask)
    return {"samples": data, "rollout_mask_sums": [sums[s.rollout_id] for s in data]}


def test_rollout_function_returns_slime_samples(run_dir, groups):
    fn = SlimeRollout(GroupReader(run_dir, order="task"), sample_cls=SlimeSample, timeout=0)
    out = fn(Namespace(rollout_batch_size=2), 0, None)
    # [group][rollout][chain]: t0 = (t0.0: 1 chain), (t0.1: branch, main, fork)
    assert [[len(r) for r in g] for g in out] == [[1, 3], [1, 1]]
    train = slime_train_data(out)
    flat = train["samples"]
    farm = [s for g in groups[:2] for s in g.samples]
    assert len(flat) == len(farm) == 6
    for sl, s in zip(flat, farm):
        assert sl.tokens == s.tokens.tolist() and sl.response_length == s.response_length
        assert sl.loss_mask == s.loss_mask.tolist()
        np.testing.assert_array_equal(np.float32(sl.rollout_log_probs), s.rollout_logprobs)
        assert sl.reward == s.reward and sl.status is SlimeSample.Status.COMPLETED
        assert sl.group_index == s.group_index and sl.rollout_id == rollout_key(s.rollout_id)
        assert sl.weight_versions and all(isinstance(v, str) for v in sl.weight_versions)
        assert sl.metadata["farm"]["chain_index"] == s.chain_index
    assert len({s.index for s in flat}) == 6 and len({s.rollout_id for s in flat}) == 4
    # the three chains of t0.1 are one rollout for slime's loss reducer
    t01 = [i for i, s in enumerate(farm) if s.rollout_id == "t0.1"]
    assert {train["rollout_mask_sums"][i] for i in t01} == {sum(farm[i].num_trained_tokens for i in t01)}
    assert [len(g) for g in fn(Namespace(rollout_batch_size=2), 1, None)] == [2, 2]  # t3, t4
    with pytest.raises(IntegrationError, match="no group"):
        fn(Namespace(rollout_batch_size=2), 2, None)


def test_generate_rollout_from_args_and_resume(run_dir):
    args = Namespace(rollout_batch_size=2, farm_output_dir=str(run_dir), farm_timeout_s=0)
    out = generate_rollout(args, 0, None)  # no slime here: the documented dict form, legacy bare list
    d = out[0][1][2]
    assert set(d) <= set(SlimeSample.__dataclass_fields__) and d["status"] == "completed"
    assert SlimeSample.from_dict(d).rollout_id == rollout_key("t0.1")
    assert generate_rollout(args, 1, None)[0][0][0]["metadata"]["farm"]["task_id"] == "t3"  # state kept on args
    # a restarted slime (first call at step 1) skips the groups step 0 took
    resumed = Namespace(rollout_batch_size=2, farm_output_dir=str(run_dir), farm_timeout_s=0)
    assert [g[0][0]["metadata"]["farm"]["task_id"] for g in generate_rollout(resumed, 1, None)] == ["t3", "t4"]
    with pytest.raises(IntegrationError, match="farm_output_dir or farm_source_fn"):
        generate_rollout(Namespace(rollout_batch_size=2), 0, None)


def test_a_restarted_slime_continues_from_the_saved_cursor(run_dir, tmp_path, monkeypatch):
    from farm.output import groups as group_reader

    def args():
        return Namespace(rollout_batch_size=2, farm_output_dir=str(run_dir), farm_timeout_s=0,
                         farm_cursor_dir=str(tmp_path / "cursors"))  # fmt: skip

    first = args()
    generate_rollout(first, 0, None)
    assert (tmp_path / "cursors" / "step-00000000.json").is_file()
    polled: list[int] = []  # groups the restarted reader builds
    real = group_reader.GroupReader._build
    monkeypatch.setattr(group_reader.GroupReader, "_build",
                        lambda self, gid, rows: polled.append(1) or real(self, gid, rows))  # fmt: skip
    resumed = args()
    assert [g[0][0]["metadata"]["farm"]["task_id"] for g in generate_rollout(resumed, 1, None)] == ["t3", "t4"]
    # step 0's groups (t0, t1) and the incomplete t2 are not read again: only t3, t4, which
    # step 0's reader had polled and not handed out, are rebuilt from the cursor
    assert resumed._farm_slime_rollout.groups_taken == 2 and len(polled) == 2
    # a cursor that no longer fits the directory: read from the start, skipping step 0's groups
    (tmp_path / "cursors" / "step-00000000.json").write_text("{}")
    again = args()
    assert [g[0][0]["metadata"]["farm"]["task_id"] for g in generate_rollout(again, 1, None)] == ["t3", "t4"]
    assert again._farm_slime_rollout.groups_taken == 4


def test_source_fn_and_evaluation_delegates_to_slime(groups, monkeypatch):
    built = []
    mod = types.ModuleType("farm_test_source")
    mod.make = lambda args: built.append(args) or list(groups)
    monkeypatch.setitem(sys.modules, "farm_test_source", mod)
    args = Namespace(rollout_batch_size=2, farm_source_fn="farm_test_source:make")
    assert [len(generate_rollout(args, step, None)) for step in (0, 1)] == [2, 2]
    assert built == [args]  # built once, kept on args between steps
    # a live source (a farm.Farm) hands out only new groups: nothing skipped on a resume
    fresh = Namespace(rollout_batch_size=2, farm_source_fn="farm_test_source:make")
    assert generate_rollout(fresh, 7, None)[0][0][0]["metadata"]["farm"]["task_id"] == "t0"
    calls = []
    for name in ("slime", "slime.rollout", "slime.rollout.sglang_rollout"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["slime.rollout.sglang_rollout"].generate_rollout = lambda *a, **kw: calls.append((a, kw)) or "eval"
    assert generate_rollout(args, 5, "ds", evaluation=True) == "eval"
    assert calls == [((args, 5, "ds"), {"evaluation": True})]


def test_reward_post_process_normalizes_per_farm_group(run_dir):
    fn = SlimeRollout(GroupReader(run_dir, order="task"), sample_cls=SlimeSample, timeout=0)
    flat = slime_train_data(fn(Namespace(rollout_batch_size=4), 0, None))["samples"]
    raw, rewards = reward_post_process(Namespace(advantage_estimator="grpo", rewards_normalization=True,
                                                 grpo_std_normalization=True), flat)  # fmt: skip
    assert raw == [s.reward for s in flat]
    by_rollout = {}
    for s, r in zip(flat, rewards):
        by_rollout.setdefault(s.metadata["farm"]["rollout_id"], set()).add(round(r, 9))
    assert all(len(v) == 1 for v in by_rollout.values())  # every chain of a rollout: its rollout's advantage
    adv = {k: v.pop() for k, v in by_rollout.items()}
    for task in ("t0", "t1", "t3", "t4"):  # mean 0 over each group's rollouts, not its rows
        assert adv[f"{task}.0"] + adv[f"{task}.1"] == pytest.approx(0.0, abs=1e-6)
    assert adv["t3.0"] == pytest.approx(1 / (np.std([1.0, 0.0], ddof=1) + 1e-6) * 0.5)
    plain = Namespace(advantage_estimator="ppo", rewards_normalization=True)
    assert reward_post_process(plain, flat) == (raw, raw)
    # groups of one rollout (rollout.n_samples: 1): every normalized reward is 0, and slime's log says why
    ones = [s for s in flat if s.metadata["farm"]["rollout_id"].endswith(".0")]
    grpo = Namespace(advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True)
    with pytest.warns(GroupsOfOneWarning, match="rollout.n_samples >= 2"):
        assert set(reward_post_process(grpo, ones)[1]) == {0.0}


def test_reward_post_process_uses_the_rollout_reward_under_split():
    """output.reward_policy=split: a rollout's K chains carry reward / K each."""
    def sample(rid, reward, rollout_reward):
        return SlimeSample(rollout_id=rollout_key(rid), reward=reward, status=SlimeSample.Status.COMPLETED,
                           metadata={"rollout_reward": rollout_reward, "farm": {"group_id": "g", "rollout_id": rid}})

    flat = [sample("a", 1 / 3, 1.0)] * 3 + [sample("b", 0.0, 0.0)]
    _, rewards = reward_post_process(Namespace(advantage_estimator="grpo", grpo_std_normalization=False), flat)
    assert rewards == pytest.approx([0.5, 0.5, 0.5, -0.5])
