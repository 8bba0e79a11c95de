"""Routed experts in the turn tree and in Samples: incremental rows per turn, realign
that re-tokenizes context (rows from there on are invalid unless the turn fetched them
again), retries, parallel tool results, several chains; the compact dtypes; Arrow."""

from __future__ import annotations

import numpy as np
import pytest
from trj_helpers import lin, lp

from farm.engine.routing import MoEShape, decode_routed, encode_routed, fake_routing
from farm.errors import EngineError, TrajectoryError
from farm.trajectory import TurnTree
from farm.trajectory.schema import from_slime_dict, samples_to_table, table_to_samples, to_slime_dict

MOE = MoEShape(layers=4, top_k=2, experts=64)


def rows(seq, start, shape=MOE):
    seq = np.asarray(seq, dtype=np.int64)
    return fake_routing(seq, start, len(seq) - 1, shape).astype(shape.dtype)


def append(t, parent, delta, out, **kw):
    """An appended turn with the rows an incremental request returns (from the parent's last token)."""
    seq = (t.sequence_ids(parent).tolist() if parent else []) + delta + out
    start = t.get(parent).sequence_length - 1 if parent else 0
    return t.append(parent_id=parent, prompt_delta_ids=delta, output_ids=out, output_logprobs=lp(len(out)),
                    finish_reason="stop", routed_experts=rows(seq, start), routed_start=start, **kw)


def check(sample, shape=MOE):
    """Known positions hold the experts of this Sample's own tokens; returns the unknown spans."""
    n = len(sample.tokens)
    expected = fake_routing(sample.tokens.astype(np.int64), 0, n - 1, shape)
    unknown = sample.metadata["routed_experts"]["unknown_spans"]
    known = np.ones(n - 1, dtype=bool)
    for a, b in unknown:
        known[a:b] = False
        assert not sample.routed_experts[a:b].any()  # unknown rows are zeros, never stale experts
    assert np.array_equal(sample.routed_experts[known].astype(np.int32), expected[known])
    return unknown


def _tree(full_refetch: bool):
    t = TurnTree("s", max_realign_tokens=64)
    msgs = [{"role": "user", "content": "u"}]
    a = t.mount(prompt_ids=[1, 2, 3], output_ids=[101, 102, 103], output_logprobs=lp(3), finish_reason="stop",
                messages=msgs, response={"role": "assistant", "content": "a"},
                routed_experts=rows([1, 2, 3, 101, 102, 103], 0), routed_start=0)  # fmt: skip
    results = [{"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]  # parallel calls' results
    b = append(t, a.turn_id, [5, 6, 7, 8], [111, 112], messages=results, response={"role": "assistant", "content": "b"})
    append(t, a.turn_id, [5, 6, 7, 9], [121], messages=results, response={"role": "assistant", "content": "b2"})  # retry
    c = append(t, b.turn_id, [10], [131, 132, 133], messages=[{"role": "tool", "content": "r3"}],
               response={"role": "assistant", "content": "c"})  # fmt: skip
    hist = t.history(c.turn_id) + [{"role": "user", "content": "more"}]
    seq_c = t.sequence_ids(c.turn_id).tolist()
    seen = seq_c[:-2] + [77] + seq_c[-2:] + [11]  # the echo of c's output was re-tokenized
    out = [141, 142]
    start = 0 if full_refetch else len(seq_c) - 1  # as if the turn had been appended: stale context
    d = t.mount(prompt_ids=seen, output_ids=out, output_logprobs=lp(2), finish_reason="stop", messages=hist,
                routed_experts=rows(seen + out, start), routed_start=start)  # fmt: skip
    return t, d, seq_c


def test_every_chain_aligns_through_append_retry_parallel_results_and_realign():
    t, d, _ = _tree(full_refetch=True)
    assert "drift_realigned" in {f.value for f in d.flags}
    samples = lin(t)
    assert len(samples) >= 3  # a's chain (cut by the realign), the retry, d's chain
    for s in samples:
        assert s.routed_experts.shape == (len(s.tokens) - 1, MOE.layers, MOE.top_k)
        assert check(s) == []


def test_a_realign_never_pairs_old_experts_with_new_tokens():
    t, d, seq_c = _tree(full_refetch=False)
    s_d = next(s for s in lin(t) if s.metadata["turn_ids"][-1] == d.turn_id)
    # positions from the realign offset up to where d's own rows start were routed for the old tokens
    assert check(s_d) == [[d.prompt_offset, len(seq_c) - 1]]


def test_rows_must_cover_the_turn_and_the_dtype_is_compact():
    t = TurnTree("s")
    with pytest.raises(TrajectoryError, match="do not cover"):
        t.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-1.0],
                 finish_reason="stop", routed_experts=rows([1, 2, 3], 0)[:1], routed_start=0)  # fmt: skip
    assert MOE.dtype == np.uint8 and MoEShape(layers=1, top_k=1, experts=256).dtype == np.uint8
    assert MoEShape(layers=1, top_k=1, experts=257).dtype == np.uint16


def test_wire_format_round_trip_and_checks():
    ids = fake_routing(np.arange(10), 3, 9, MOE)
    assert ids.shape == (6, 4, 2) and all(len(set(r)) == 2 for r in ids.reshape(-1, 2))  # top_k distinct
    assert np.array_equal(decode_routed(encode_routed(ids), 6, MOE), ids)
    with pytest.raises(EngineError, match="expected 5 positions"):
        decode_routed(encode_routed(ids), 5, MOE)
    with pytest.raises(EngineError, match="experts"):
        decode_routed(encode_routed(ids + 64), 6, MOE)
    big = MoEShape(layers=2, top_k=8, experts=300)
    wide = fake_routing(np.arange(5), 0, 4, big)
    assert decode_routed(encode_routed(wide), 4, big).dtype == np.uint16 and wide.max() < 300


def test_arrow_and_slime_carry_the_experts():
    t, _, _ = _tree(full_refetch=True)
    samples = lin(t)
    back = table_to_samples(samples_to_table(samples))
    for a, b in zip(samples, back):
        assert np.array_equal(a.routed_experts, b.routed_experts) and b.routed_experts.dtype == np.uint8
        d = to_slime_dict(b)
        assert d["rollout_routed_experts"].shape == (len(d["tokens"]) - 1, MOE.layers, MOE.top_k)
        assert np.array_equal(from_slime_dict(d).routed_experts, b.routed_experts)
    plain = TurnTree("p")
    plain.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-1.0], finish_reason="stop")
    [s] = lin(plain)
    assert s.routed_experts is None and table_to_samples(samples_to_table([s]))[0].routed_experts is None


def test_the_torch_dataset_yields_the_experts_as_a_tensor():
    torch = pytest.importorskip("torch")
    from farm.output.torch_data import sample_tensors

    t, _, _ = _tree(full_refetch=True)
    for s in lin(t):
        row = sample_tensors(s)
        assert row["routed_experts"].shape == (len(s.tokens) - 1, MOE.layers, MOE.top_k)
        assert torch.equal(row["routed_experts"], torch.from_numpy(s.routed_experts.astype("int64")))
