"""Sample model invariants, Arrow schema round trip, slime-style dicts."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError
from trj_helpers import add, lin

from farm.trajectory import (
    SAMPLE_SCHEMA,
    Sample,
    TurnTree,
    from_slime_dict,
    samples_to_table,
    table_to_samples,
    to_slime_dict,
)

# SAMPLE_SCHEMA as it was written by hand (schema version 2) before it was derived from Sample:
# what shards already on disk hold, so never edit a line here; a new column goes at the end of both.
GOLDEN = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("rollout_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("chain_index", pa.int32(), nullable=False),
        pa.field("chain_kind", pa.string(), nullable=False),
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("group_index", pa.int64(), nullable=True),
        pa.field("policy_version_min", pa.int64(), nullable=True),
        pa.field("policy_version_max", pa.int64(), nullable=True),
        pa.field("tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("prompt_length", pa.int32(), nullable=False),
        pa.field("response_length", pa.int32(), nullable=False),
        pa.field("loss_mask", pa.list_(pa.uint8()), nullable=False),
        pa.field("rollout_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("reward", pa.float64(), nullable=True),
        pa.field("status", pa.string(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("num_turns", pa.int32(), nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
        pa.field("routed_experts", pa.large_binary(), nullable=True),
    ],
    metadata={b"farm.table": b"samples", b"farm.schema_version": b"2"},
)
# the sha256 of the hand-written schema's IPC serialization (pyarrow's bytes for it)
GOLDEN_SHA256 = "afa08607689cc9f5cc16dbce60fbf8013b0b6b4cd2600a50763db9ae53f966ab"
# an output directory's samples table written with the hand-written schema (two Samples, one with
# nulls and routed experts), read by today's reader
WRITTEN_BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "outdir_samples_v2"

GOOD = dict(rollout_id="r", tokens=[1, 2, 3, 4], prompt_length=2, response_length=2,
            loss_mask=[0, 1], rollout_logprobs=[0.0, -0.5])  # fmt: skip


def test_valid_sample_is_numpy_backed():
    s = Sample(**GOOD)
    assert s.tokens.dtype == np.int32 and s.loss_mask.dtype == np.uint8 and s.rollout_logprobs.dtype == np.float32
    assert s.num_trained_tokens == 1 and s.response_tokens.tolist() == [3, 4]
    assert Sample.model_validate_json(s.model_dump_json()).model_dump_json() == s.model_dump_json()


@pytest.mark.parametrize(
    "change,match",
    [
        ({"prompt_length": 1}, "prompt_length"),
        ({"loss_mask": [1]}, "loss_mask has"),
        ({"rollout_logprobs": [0.0]}, "rollout_logprobs has"),
        ({"loss_mask": [0, 2]}, "0 or 1"),
        ({"rollout_logprobs": [-1.0, -0.5]}, "0.0 where loss_mask is 0"),
        ({"rollout_logprobs": [0.0, float("nan")]}, "finite"),
        ({"tokens": [[1, 2], [3, 4]]}, "1-D"),
        ({"extra_field": 1}, "extra"),
    ],
)
def test_invariants_are_enforced(change, match):
    with pytest.raises(ValidationError, match=match):
        Sample(**{**GOOD, **change})


def test_every_sample_that_constructs_converts_to_its_arrow_row():
    """The reducer builds one table for a commit's many rollouts: a value its column cannot
    hold must fail the Sample's construction (that rollout alone), never the batch's table."""
    ints = {f.name: f.type for f in SAMPLE_SCHEMA if pa.types.is_integer(f.type)}
    assert set(ints) >= {"sample_index", "chain_index", "num_turns", "group_index", "prompt_length"}
    for name, dtype in ints.items():
        top = 2 ** (dtype.bit_width - 1) - 1
        if name in ("prompt_length", "response_length"):  # their sum is the token count
            continue
        assert samples_to_table([Sample(**{**GOOD, name: top})]).column(name)[0].as_py() == top
        with pytest.raises(ValidationError, match=name):
            Sample(**{**GOOD, name: top + 1})
    for name in ("prompt_length", "response_length"):
        with pytest.raises(ValidationError, match=name):
            Sample(**{**GOOD, name: 2**31})


def _samples():
    t = TurnTree("sess")
    a = add(t, None, [1, 2], [101, 102], policy_version=7)
    add(t, a.turn_id, [3], [103])
    add(t, a.turn_id, [4], [104], finish_reason="length")
    return lin(t, reward=0.5)


def test_arrow_roundtrip_and_schema():
    samples = _samples()
    table = samples_to_table(samples)
    assert table.schema.equals(SAMPLE_SCHEMA) and table.num_rows == 2
    assert table.schema.metadata[b"farm.table"] == b"samples"
    back = table_to_samples(table)
    assert [b.model_dump_json() for b in back] == [s.model_dump_json() for s in samples]
    assert table_to_samples(SAMPLE_SCHEMA.empty_table()) == []
    assert table_to_samples(table.to_batches()[0])[0].rollout_id == "r0"


def test_slime_dict_roundtrip(hf_tokenizer):
    for s in _samples():
        d = to_slime_dict(s)
        assert d["response_length"] == len(d["loss_mask"]) == len(d["rollout_log_probs"]) == s.response_length
        assert d["tokens"] == s.tokens.tolist() and d["reward"] == 0.5 and d["session_id"] == "sess"
        assert d["weight_versions"] == [str(v) for v in s.metadata["policy_versions"]]
        assert from_slime_dict(d).model_dump_json() == s.model_dump_json()
    last = to_slime_dict(_samples()[1], tokenizer=hf_tokenizer)
    assert last["status"] == "truncated" and isinstance(last["response"], str)
    # a rollout whose policy ran out of a budget is truncated for slime, however its chain's last turn ended
    cut = _samples()[0].model_copy(update={"status": "truncated"})
    assert cut.finish_reason == "stop" and to_slime_dict(cut)["status"] == "truncated"
    assert from_slime_dict(to_slime_dict(cut)).model_dump_json() == cut.model_dump_json()


def test_plain_slime_dict_is_accepted():
    s = from_slime_dict({"tokens": [5, 6, 7], "response_length": 2, "loss_mask": [0, 1],
                         "rollout_log_probs": [-0.3, -0.2], "reward": 1.0, "status": "completed", "index": 3})  # fmt: skip
    assert s.prompt_length == 1 and s.rollout_logprobs.tolist() == [0.0, pytest.approx(-0.2)]
    assert s.rollout_id == "3" and s.finish_reason == "stop"


def test_the_sample_schema_derived_from_the_model_is_the_hand_written_one():
    """``SAMPLE_SCHEMA`` is derived from ``Sample`` (one declaration, as the rollouts and
    transcripts tables'): byte for byte the schema farm wrote before: names, order, types,
    nullability, metadata."""
    assert SAMPLE_SCHEMA.equals(GOLDEN, check_metadata=True)
    assert [(f.name, f.type, f.nullable, f.metadata) for f in SAMPLE_SCHEMA] == [
        (f.name, f.type, f.nullable, f.metadata) for f in GOLDEN]
    assert hashlib.sha256(SAMPLE_SCHEMA.serialize().to_pybytes()).hexdigest() == GOLDEN_SHA256
    assert hashlib.sha256(GOLDEN.serialize().to_pybytes()).hexdigest() == GOLDEN_SHA256
    assert SAMPLE_SCHEMA.names == list(Sample.model_fields)


def test_a_samples_table_written_before_still_reads(tmp_path):
    from farm.output.reader import open_sample_reader

    shutil.copytree(WRITTEN_BEFORE, tmp_path / "out")
    table = open_sample_reader(tmp_path / "out").read_table()  # checksums verified
    assert table.schema.equals(SAMPLE_SCHEMA, check_metadata=True)
    first, second = table_to_samples(table)
    assert (first.rollout_id, first.group_index, first.policy_version_min, first.reward) == ("t0.0", 3, 1, 1.0)
    assert first.tokens.tolist() == [1, 2, 3, 4, 5] and first.loss_mask.tolist() == [1, 0, 1]
    assert first.metadata == {"attempt": 1, "reason": ""} and first.routed_experts is None
    assert (second.chain_kind, second.status, second.reward, second.group_index) == ("side", "truncated", None, None)
    assert second.rollout_logprobs.tolist() == [0.0, -1.5]
    assert second.routed_experts.tolist() == np.arange(8, dtype=np.uint8).reshape(2, 2, 2).tolist()
    assert samples_to_table([first, second]).equals(table)
