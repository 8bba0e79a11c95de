"""Golden tree shapes -> exact Samples (synthetic ids: prompt ids < 100 <= output ids)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from trj_helpers import add, lin, lp, mask_of, outputs, trained

from farm.errors import TrajectoryError
from farm.trajectory import FinishReason, TurnFlag, TurnTree, chain_ends
from farm.trajectory.records import Budget, BudgetStop


def test_single_turn():
    t = TurnTree("s")
    r = add(t, None, [1, 2, 3], [101, 102])
    [s] = lin(t)
    assert s.tokens.tolist() == [1, 2, 3, 101, 102]
    assert (s.prompt_length, s.response_length, s.num_turns) == (3, 2, 1)
    assert mask_of(s) == [1, 1]
    assert s.rollout_logprobs.tolist() == pytest.approx(lp(2))
    assert s.chain_kind == "main" and s.finish_reason == "stop" and s.reward == 1.0
    assert s.metadata["trained_turn_ids"] == [r.turn_id]
    assert t.sequence_ids(r.turn_id).tolist() == s.tokens.tolist()


def test_multi_turn_with_tools_trains_outputs_only():
    t = TurnTree("s")
    a = add(t, None, [1, 2], [101, 102])  # calls a tool
    b = add(t, a.turn_id, [3, 4, 5], [103])  # tool result in the delta
    c = add(t, b.turn_id, [6], [104, 105], finish_reason="length")
    [s] = lin(t)
    assert s.tokens.tolist() == [1, 2, 101, 102, 3, 4, 5, 103, 6, 104, 105]
    assert s.prompt_length == 2
    assert mask_of(s) == [1, 1, 0, 0, 0, 1, 0, 1, 1]
    assert trained(s) == outputs(t, a.turn_id, b.turn_id, c.turn_id)
    assert s.rollout_logprobs.tolist() == pytest.approx(lp(2) + [0, 0, 0] + lp(1) + [0] + lp(2))
    assert s.finish_reason == "length" and s.num_turns == 3
    assert b.prompt_length == 7 and b.prompt_delta_ids.tolist() == [3, 4, 5]


def test_parallel_tool_calls_are_one_turn():
    # two tool calls in one output, both results in one delta: still one chain
    t = TurnTree("s")
    a = add(t, None, [1], [101, 102, 103, 104])
    b = add(t, a.turn_id, [7, 8, 9, 10], [105])
    [s] = lin(t)
    assert trained(s) == outputs(t, a.turn_id, b.turn_id)
    assert s.metadata["turn_ids"] == [a.turn_id, b.turn_id]


def test_sub_agent_is_its_own_root_and_sample():
    t = TurnTree("s")
    m0 = add(t, None, [1, 2], [101])
    sub0 = add(t, None, [50, 51], [150])  # sub-agent: own system prompt -> new root
    m1 = add(t, m0.turn_id, [3], [102])
    sub1 = add(t, sub0.turn_id, [52], [151])
    m2 = add(t, m1.turn_id, [4], [103])
    samples = lin(t)
    assert [s.chain_kind for s in samples] == ["main", "fork"]
    main, sub = samples
    assert trained(main) == outputs(t, m0.turn_id, m1.turn_id, m2.turn_id)
    assert trained(sub) == outputs(t, sub0.turn_id, sub1.turn_id)
    assert sub.tokens.tolist() == [50, 51, 150, 52, 151]
    assert t.drift.new_roots == 2 and t.drift.appended == 3


def test_compaction_branch():
    t = TurnTree("s")
    a0 = add(t, None, [1], [101])
    a1 = add(t, a0.turn_id, [2], [102])
    summary = add(t, a1.turn_id, [3, 3], [110, 111])  # "summarise the conversation"
    c0 = add(t, None, [9, 110, 111], [120])  # new context starting from the summary
    c1 = add(t, c0.turn_id, [4], [121])
    samples = lin(t)
    assert [s.chain_kind for s in samples] == ["fork", "main"]
    assert trained(samples[0]) == outputs(t, a0.turn_id, a1.turn_id, summary.turn_id)
    # the summary appears in the compacted prompt but is prompt there: not trained twice
    assert trained(samples[1]) == outputs(t, c0.turn_id, c1.turn_id)
    assert samples[1].prompt_length == 3


def test_retry_siblings_train_shared_prefix_once():
    t = TurnTree("s")
    a = add(t, None, [1], [101])
    bad = add(t, a.turn_id, [2], [102, 103], finish_reason=FinishReason.ERROR, output_logprobs=[])
    retry = add(t, a.turn_id, [2], [104])
    s1, s2 = lin(t)
    # labelled by how each was formed: the first attempt branches off, the session ends in a retry
    assert [s.chain_kind for s in (s1, s2)] == ["branch", "retry"]
    assert [s.metadata["final"] for s in (s1, s2)] == [False, True]  # where the agent ended
    assert s1.metadata["turn_ids"] == [a.turn_id, bad.turn_id]
    assert trained(s1) == outputs(t, a.turn_id)  # the ERROR turn never trains
    assert trained(s2) == outputs(t, retry.turn_id)  # the shared prefix trains once
    assert mask_of(s2) == [0, 0, 1]
    assert s1.finish_reason == "error"


def test_empty_response_and_untrainable_chains():
    t = TurnTree("s")
    a = add(t, None, [1, 2], [])  # empty output (stop at once)
    assert lin(t) == []  # nothing to train: dropped by default
    [s] = lin(t, keep_untrained=True)
    assert s.response_length == 0 and s.tokens.tolist() == [1, 2]
    b = add(t, a.turn_id, [3], [101])
    [s] = lin(t)
    assert s.tokens.tolist() == [1, 2, 3, 101] and mask_of(s) == [0, 1]


def test_side_requests_never_train():
    t = TurnTree("s")
    add(t, None, [60], [160], trainable=False, flags={TurnFlag.SIDE_REQUEST})  # title request
    main = add(t, None, [1], [101])
    add(t, main.turn_id, [2], [102], flags={TurnFlag.SIDE_REQUEST})  # flagged side turn
    [s] = lin(t)
    assert s.chain_kind == "main" and s.chain_index == 1  # stable index: the side chain was chain 0
    assert trained(s) == [101]
    samples = lin(t, keep_untrained=True)
    assert [s.chain_kind for s in samples] == ["side", "main"]
    assert samples[0].loss_mask.sum() == 0 and samples[0].chain_index == 0


def test_missing_logprobs_are_reported():
    t = TurnTree("s")
    a = add(t, None, [1], [101, 102], output_logprobs=[])
    [s] = lin(t)
    assert mask_of(s) == [1, 1] and s.rollout_logprobs.tolist() == [0.0, 0.0]
    assert s.metadata["missing_logprobs_turns"] == [a.turn_id]


@pytest.mark.parametrize("policy,expected", [("each", [1.0, 1.0]), ("split", [0.5, 0.5])])
def test_reward_policies(policy, expected):
    t = TurnTree("s")
    a = add(t, None, [1], [101])
    add(t, a.turn_id, [2], [102])
    add(t, a.turn_id, [3], [103])
    assert [s.reward for s in lin(t, reward_policy=policy)] == expected
    assert [s.reward for s in lin(t, reward=None, reward_policy=policy)] == [None, None]


def test_policy_version_is_oldest_trained():
    t = TurnTree("s")
    a = add(t, None, [1], [101], policy_version=3)
    add(t, a.turn_id, [2], [102], policy_version=4)
    [s] = lin(t)
    assert (s.policy_version_min, s.policy_version_max) == (3, 4) and s.metadata["policy_versions"] == [3, 4]


# ---- drift: each class ----------------------------------------------------------
def _conv(t: TurnTree):
    h0 = [{"role": "user", "content": "fix it"}]
    r0 = {"role": "assistant", "content": "looking"}
    a = t.mount(prompt_ids=[1, 2], output_ids=[101, 102, 103], output_logprobs=lp(3), finish_reason="stop",
                messages=h0, response=r0)  # fmt: skip
    return a, h0 + [r0, {"role": "user", "content": "go on"}]


def test_drift_clean_mount():
    t = TurnTree("s")
    a, hist = _conv(t)
    b = t.mount(prompt_ids=[1, 2, 101, 102, 103, 5], output_ids=[104], output_logprobs=lp(1),
                finish_reason="stop", messages=hist)  # fmt: skip
    assert b.parent_id == a.turn_id and b.prompt_delta_ids.tolist() == [5] and b.messages == (hist[-1],)
    assert t.drift.mounted_clean == 1 and t.drift.new_roots == 1
    assert t.history(b.turn_id) == hist
    [s] = lin(t)
    assert trained(s) == [101, 102, 103, 104]


def test_drift_realign_keeps_the_prompt_as_seen():
    t = TurnTree("s")
    a, hist = _conv(t)
    seen = [1, 2, 101, 99, 102, 103, 5]  # the echo of a's output was re-tokenised (103 kept)
    b = t.mount(prompt_ids=seen, output_ids=[104], output_logprobs=lp(1), finish_reason="stop", messages=hist)
    assert b.parent_id == a.turn_id and b.prompt_offset == 3 and TurnFlag.DRIFT_REALIGNED in b.flags
    assert b.prompt_delta_ids.tolist() == [99, 102, 103, 5] and b.mask_spans == ((0, 3),)
    assert t.drift.realigned == 1 and t.drift.realigned_dropped_tokens == 2
    assert t.sequence_ids(b.turn_id).tolist() == seen + [104]
    assert [x.turn_id for x in chain_ends(t)] == [a.turn_id, b.turn_id]
    s_a, s_b = lin(t)
    # a's output trains in its own chain, intact; b's Sample is exactly what the model saw
    assert s_a.tokens.tolist() == [1, 2, 101, 102, 103] and trained(s_a) == [101, 102, 103]
    assert s_b.tokens.tolist() == seen + [104] and trained(s_b) == [104]
    assert s_b.metadata["drift_spans"] == [[3, 6]]


def test_drift_fork_when_tokens_drift_too_far():
    t = TurnTree("s", max_realign_tokens=1)
    a, hist = _conv(t)
    b = t.mount(prompt_ids=[1, 2, 101, 99, 102, 103, 5], output_ids=[104], output_logprobs=lp(1),
                finish_reason="stop", messages=hist)  # fmt: skip
    assert b.parent_id is None and TurnFlag.DRIFT_FORKED in b.flags
    assert b.meta["drift"]["parent"] == a.turn_id and b.messages == tuple(hist)
    assert t.drift.forked == 1
    s_a, s_b = lin(t)
    assert s_b.chain_kind == "main" and s_a.chain_kind == "fork"
    assert trained(s_b) == [104] and s_b.prompt_length == 7


def test_drift_new_root_when_history_unknown():
    t = TurnTree("s")
    _conv(t)
    c = t.mount(prompt_ids=[7], output_ids=[107], output_logprobs=lp(1), finish_reason="stop",
                messages=[{"role": "user", "content": "other"}])  # fmt: skip
    assert c.parent_id is None and c.meta["drift"] == {"kind": "new_root"} and t.drift.new_roots == 2


def test_retry_found_by_history_is_a_sibling():
    t = TurnTree("s")
    a, hist = _conv(t)
    b1 = t.mount(prompt_ids=[1, 2, 101, 102, 103, 5], output_ids=[104], output_logprobs=lp(1),
                 finish_reason="stop", messages=hist, response={"role": "assistant", "content": "x"})  # fmt: skip
    b2 = t.mount(prompt_ids=[1, 2, 101, 102, 103, 5], output_ids=[105], output_logprobs=lp(1),
                 finish_reason="stop", messages=hist, response={"role": "assistant", "content": "y"})  # fmt: skip
    assert b1.parent_id == b2.parent_id == a.turn_id
    assert [c.turn_id for c in t.children(a.turn_id)] == [b1.turn_id, b2.turn_id]


# ---- tree API ---------------------------------------------------------------------
def test_unknown_parent_and_bad_records_raise():
    t = TurnTree("s")
    with pytest.raises(TrajectoryError, match="unknown parent"):
        add(t, "nope", [1], [2])
    with pytest.raises(TrajectoryError, match="logprobs"):
        add(t, None, [1], [2, 3], output_logprobs=[-1.0])
    a = add(t, None, [1], [2], turn_id="x")
    with pytest.raises(TrajectoryError, match="duplicate"):
        add(t, a.turn_id, [1], [2], turn_id="x")
    with pytest.raises(TrajectoryError):
        t.get("missing")


def test_tree_accessors_pickle_and_dict_roundtrip():
    t = TurnTree("s")
    a, hist = _conv(t)
    b = t.mount(prompt_ids=[1, 2, 101, 99, 102, 103, 5], output_ids=[104], output_logprobs=lp(1),
                finish_reason="stop", messages=hist)  # fmt: skip
    c = add(t, a.turn_id, [9], [], finish_reason="abort")
    assert len(t) == 3 and [x.turn_id for x in t.turns] == [a.turn_id, b.turn_id, c.turn_id]
    assert [x.turn_id for x in t.leaves()] == [b.turn_id, c.turn_id]
    seqs = {x.turn_id: t.sequence_ids(x.turn_id).tolist() for x in t.turns}
    assert TurnTree.from_dict(t.to_dict()).budget_stop is None
    t.budget_stop = BudgetStop(budget=Budget.CONTEXT, limit=4096, turns=3)
    for copy in (pickle.loads(pickle.dumps(t)), TurnTree.from_dict(t.to_dict())):
        assert {x.turn_id: copy.sequence_ids(x.turn_id).tolist() for x in copy.turns} == seqs
        assert copy.drift == t.drift and copy.history(b.turn_id) == t.history(b.turn_id)
        assert copy.budget_stop == t.budget_stop
        assert [s.tokens.tolist() for s in lin(copy)] == [s.tokens.tolist() for s in lin(t)]
        # the copy keeps mounting by history
        d = copy.mount(prompt_ids=[1, 2, 101, 102, 103, 6], output_ids=[1], output_logprobs=[],
                       finish_reason="stop", messages=hist)  # fmt: skip
        assert d.parent_id == a.turn_id
    assert isinstance(t.sequence_ids(a.turn_id), np.ndarray) and t.sequence_ids(a.turn_id).dtype == np.int32
    assert t.prompt_ids(b.turn_id).tolist() == [1, 2, 101, 99, 102, 103, 5]


# ---- realign into the root's prompt; logprobs by value ------------------------------
def test_realign_inside_the_roots_prompt_keeps_the_mask_in_the_response():
    """The re-rendered prompt diverges at offset 1 of a 20-token root prompt: the Sample
    is exactly what the realigned turn saw, its prompt everything before the first kept
    output (no negative mask index), and the root's output trains in its own chain."""
    t = TurnTree("s", max_realign_tokens=64)
    root_prompt = list(range(1, 21))
    a = t.mount(prompt_ids=root_prompt, output_ids=[101, 102], output_logprobs=lp(2, -1.0), finish_reason="stop",
                messages=[{"role": "user", "content": "fix it"}], response={"role": "assistant", "content": "x"})  # fmt: skip
    hist = [{"role": "user", "content": "fix it"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": "go on"}]  # fmt: skip
    seen = [1, 99, 19, 20, 101, 102, 7]  # the system prompt re-rendered short; re-synced at a's tail
    b = t.mount(prompt_ids=seen, output_ids=[104, 105], output_logprobs=lp(2, -2.0), finish_reason="stop", messages=hist)
    assert b.parent_id == a.turn_id and b.prompt_offset == 1 and TurnFlag.DRIFT_REALIGNED in b.flags
    s_a, s_b = lin(t)
    assert s_a.tokens.tolist() == root_prompt + [101, 102] and s_a.prompt_length == 20 and trained(s_a) == [101, 102]
    assert s_b.tokens.tolist() == seen + [104, 105]
    assert s_b.prompt_length == len(seen) and mask_of(s_b) == [1, 1] and trained(s_b) == [104, 105]
    assert s_b.rollout_logprobs.tolist() == pytest.approx(lp(2, -2.0))


def _check_logprobs_by_value(t: TurnTree, samples) -> int:
    """Every trained token is the engine's output token with the engine's logprob for it,
    at the same position: a shift by one anywhere fails."""
    checked = 0
    for s in samples:
        resp, mask, lps = s.response_tokens, s.loss_mask, s.rollout_logprobs
        runs = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        spans = list(zip(runs[::2], runs[1::2]))
        assert len(spans) == len(s.metadata["trained_turn_ids"])
        for (lo, hi), tid in zip(spans, s.metadata["trained_turn_ids"]):
            rec = t.get(tid)
            assert resp[lo:hi].tolist() == rec.output_ids.tolist()
            assert lps[lo:hi].tolist() == pytest.approx(rec.output_logprobs.tolist())
            checked += hi - lo
        assert not lps[mask == 0].any()
    return checked


def test_logprobs_follow_their_tokens_through_every_shape():
    """Append, realign, a retry sibling and parallel tool results (one turn whose delta
    holds several results): each trained token keeps its own logprob."""
    t = TurnTree("s", max_realign_tokens=64)
    a = t.mount(prompt_ids=[1, 2, 3], output_ids=[101, 102, 103], output_logprobs=lp(3, -1.0), finish_reason="stop",
                messages=[{"role": "user", "content": "u"}], response={"role": "assistant", "content": "a"})  # fmt: skip
    results = [{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]  # parallel calls' results
    b = add(t, a.turn_id, [5, 6, 7, 8], [111, 112], output_logprobs=lp(2, -2.0), messages=results,
            response={"role": "assistant", "content": "b"})  # fmt: skip
    add(t, a.turn_id, [5, 6, 7, 9], [121], output_logprobs=lp(1, -3.0), messages=results,
        response={"role": "assistant", "content": "b2"})  # a retry of b  # fmt: skip
    c = add(t, b.turn_id, [10], [131, 132, 133], output_logprobs=lp(3, -4.0),
            messages=[{"role": "tool", "content": "r3"}], response={"role": "assistant", "content": "c"})  # fmt: skip
    hist = t.history(c.turn_id) + [{"role": "user", "content": "more"}]
    seq = t.sequence_ids(c.turn_id).tolist()
    seen = seq[:-2] + [77] + seq[-2:] + [11]  # a token inserted into the echo of c's output
    d = t.mount(prompt_ids=seen, output_ids=[141, 142], output_logprobs=lp(2, -5.0), finish_reason="stop",
                messages=hist)  # fmt: skip
    assert TurnFlag.DRIFT_REALIGNED in d.flags
    samples = lin(t)
    assert _check_logprobs_by_value(t, samples) == 3 + 2 + 1 + 3 + 2  # every output trained once


def test_classify_is_clean_only_for_the_whole_parent_sequence():
    from farm.trajectory.drift import DriftKind, classify

    parent = np.array([1, 2, 3, 4], dtype=np.int32)
    assert classify(parent, np.array([1, 2, 3, 4, 9]), 8).kind is DriftKind.CLEAN
    near = classify(parent, np.array([1, 2, 3, 7, 4, 9]), 8)  # diverges at the parent's last token
    assert near.kind is DriftKind.REALIGN and near.offset == 3 and near.dropped == 1


def test_a_second_realign_drops_the_drift_spans_it_cuts():
    """b realigns onto a (a drift span), then c realigns onto b at an offset before that
    span: c's Sample keeps only its own span."""
    t = TurnTree("s", max_realign_tokens=64)
    a, hist = _conv(t)
    seen_b = [1, 2, 101, 99, 102, 103, 5]
    b = t.mount(prompt_ids=seen_b, output_ids=[104], output_logprobs=lp(1), finish_reason="stop", messages=hist,
                response={"role": "assistant", "content": "b"})  # fmt: skip
    assert b.prompt_offset == 3 and b.mask_spans == ((0, 3),)
    hist_c = hist + [{"role": "assistant", "content": "b"}, {"role": "user", "content": "more"}]
    seq_b = t.sequence_ids(b.turn_id).tolist()
    seen_c = seq_b[:2] + [88] + seq_b[2:] + [6]  # diverges at 2, before b's span [3, 6)
    c = t.mount(prompt_ids=seen_c, output_ids=[107], output_logprobs=lp(1), finish_reason="stop", messages=hist_c)
    assert c.parent_id == b.turn_id and c.prompt_offset == 2 and TurnFlag.DRIFT_REALIGNED in c.flags
    s_c = lin(t)[-1]
    assert s_c.tokens.tolist() == seen_c + [107]
    assert s_c.metadata["drift_spans"] == [[2 + lo, 2 + hi] for lo, hi in c.mask_spans]


def test_chain_kind_follows_how_the_chain_was_formed():
    t = TurnTree("s")
    a = add(t, None, [1], [101])
    b = add(t, a.turn_id, [2], [102])
    add(t, a.turn_id, [2], [103])  # a retry of b (same prompt), then the agent went on from b
    c = add(t, b.turn_id, [3], [104])
    add(t, None, [9], [109])  # a sub-agent: its own root
    add(t, None, [8], [110], flags={"side_request"})  # a title request
    end = add(t, c.turn_id, [4], [105])
    kinds = {s.metadata["turn_ids"][-1]: (s.chain_kind, s.metadata["final"]) for s in lin(t, keep_untrained=True)}
    assert kinds[end.turn_id] == ("main", True)
    assert [k for tid, k in kinds.items() if tid not in (end.turn_id,)] == [("retry", False), ("fork", False),
                                                                             ("side", False)]


# ---- a budget's refusal is no model turn -----------------------------------------------
def test_a_refusal_at_a_limit_is_in_no_sample_and_the_real_last_turn_ends_and_trains():
    """The gateway refused at the turn limit (no engine call, no output ids): the chain ends
    at the policy's real last turn, which trains; the refusal's prompt (tool results, the
    generation prompt) is in no Sample. A turn the context cut keeps its real output."""
    t = TurnTree("s")
    a = add(t, None, [1, 2, 3], [10, 11])
    b = add(t, a.turn_id, [4, 5], [12, 13], finish_reason="length", flags=frozenset({TurnFlag.CONTEXT_LIMIT}))
    refusal = add(t, b.turn_id, [6, 7, 8], [], finish_reason="length", trainable=False,
                  flags=frozenset({TurnFlag.TURN_LIMIT, TurnFlag.BUDGET_STOP}))  # fmt: skip
    assert [r.turn_id for r in chain_ends(t)] == [b.turn_id]
    (sample,) = lin(t)
    assert sample.tokens.tolist() == [1, 2, 3, 10, 11, 4, 5, 12, 13] and trained(sample) == [10, 11, 12, 13]
    assert sample.metadata["final"] and sample.chain_kind == "main" and refusal.turn_id not in sample.metadata["turn_ids"]
    # a session refused on its first request (no room for the prompt): nothing at all
    t2 = TurnTree("s2")
    add(t2, None, [1, 2, 3], [], finish_reason="length", trainable=False,
        flags=frozenset({TurnFlag.CONTEXT_LIMIT, TurnFlag.BUDGET_STOP}))  # fmt: skip
    assert chain_ends(t2) == [] and lin(t2, keep_untrained=True) == []


def test_a_turn_record_pickles_every_field():
    """A record crosses to the reducer pickled (``TurnRecord.__reduce__``: its values as one
    tuple, the id arrays as bytes): every field comes back, the arrays read-only as built."""
    import dataclasses

    import ray.cloudpickle as cloudpickle

    from farm.trajectory.records import TurnFlag, TurnRecord, as_ids, as_logprobs

    rec = TurnRecord(
        turn_id="t1", session_id="s", parent_id="t0", prompt_delta_ids=as_ids([7, 8]), prompt_length=6,
        output_ids=as_ids([9, 10, 11]), output_logprobs=as_logprobs([-0.5, -0.25, -1.0]), finish_reason="length",
        messages=({"role": "tool", "content": "ok"},), response={"role": "assistant", "content": "x"},
        tools_digest="abc", trainable=False, flags=frozenset({TurnFlag.DRIFT_REALIGNED}), policy_version=3,
        timings={"engine_ms": 12.5}, mask_spans=((0, 1),), meta={"k": [1]}, prompt_offset=4,
        routed_experts=np.arange(8 * 3 * 2, dtype=np.int32).reshape(8, 3, 2), routed_start=0,
    )  # fmt: skip
    for copy in (pickle.loads(pickle.dumps(rec)), cloudpickle.loads(cloudpickle.dumps(rec))):
        for f in dataclasses.fields(TurnRecord):
            mine, theirs = getattr(rec, f.name), getattr(copy, f.name)
            if isinstance(mine, np.ndarray):
                assert theirs.dtype == mine.dtype and theirs.tolist() == mine.tolist(), f.name
            else:
                assert theirs == mine, f.name
        for name in ("prompt_delta_ids", "output_ids", "output_logprobs"):
            assert not getattr(copy, name).flags.writeable, name
