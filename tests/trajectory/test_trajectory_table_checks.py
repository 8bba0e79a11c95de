"""Samples read back from a table are checked column-wise (farm.trajectory.table_checks):
what passes is exactly what Sample would build, and a table with any row Sample would
refuse still raises Sample's own error. The tables below are damaged in Arrow directly,
as a file on disk can be, never through Sample."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError
from trj_helpers import add, lin

from farm.trajectory import SAMPLE_SCHEMA, Sample, TurnTree, samples_to_table, table_to_samples


def _table() -> pa.Table:
    t = TurnTree("sess")
    a = add(t, None, [1, 2], [101, 102], policy_version=7)
    add(t, a.turn_id, [3], [103])
    add(t, a.turn_id, [4], [104], finish_reason="length")
    samples = lin(t, reward=0.5)
    routed = samples[0].model_copy(update={
        "rollout_id": "r-moe", "routed_experts": np.arange(len(samples[0].tokens) - 1, dtype=np.uint8).repeat(4).reshape(-1, 2, 2),
        "metadata": {**samples[0].metadata, "routed_experts": {"unknown_spans": []}}, "group_index": None,
        "reward": None})  # fmt: skip
    return samples_to_table([*samples, routed])


def _validated(samples: list[Sample]) -> list[Sample]:
    """The reference: each Sample built again through Sample's own validation."""
    return [Sample(**{name: getattr(s, name) for name in Sample.model_fields}) for s in samples]


def test_what_passes_is_what_sample_builds():
    table = _table()
    back = table_to_samples(table)
    assert [s.model_dump_json() for s in back] == [s.model_dump_json() for s in _validated(back)]
    assert back[-1].routed_experts.shape == (len(back[-1].tokens) - 1, 2, 2) and back[-1].reward is None
    # a slice of a table: its list columns' offsets do not start at 0
    part = table_to_samples(table.slice(1, 2))
    assert [s.rollout_id for s in part] == [s.rollout_id for s in back[1:3]]
    assert [s.tokens.tolist() for s in part] == [s.tokens.tolist() for s in back[1:3]]
    assert all(s.tokens.dtype == np.int32 and s.loss_mask.dtype == np.uint8 for s in back)


def _with(table: pa.Table, name: str, array: pa.Array) -> pa.Table:
    i = table.schema.get_field_index(name)
    return table.set_column(i, pa.field(name, array.type, nullable=True), array)


def _list_with(table: pa.Table, name: str, row: int, values: list) -> pa.Table:
    rows = table.column(name).to_pylist()
    rows[row] = values
    return _with(table, name, pa.array(rows, type=SAMPLE_SCHEMA.field(name).type))


def _damaged() -> dict[str, tuple[pa.Table, str]]:
    t = _table()
    mask = t.column("loss_mask").to_pylist()[1]
    logprobs = t.column("rollout_logprobs").to_pylist()[1]
    at_zero = mask.index(0)
    at_one = mask.index(1)
    return {
        "negative index": (_with(t, "sample_index", pa.array([0, -1, 0], pa.int32())), "sample_index"),
        "lengths": (_with(t, "prompt_length", pa.array([r + 1 for r in t.column("prompt_length").to_pylist()],
                                                       pa.int32())), "prompt_length"),  # fmt: skip
        "mask value": (_list_with(t, "loss_mask", 1, [*mask[:at_one], 2, *mask[at_one + 1:]]), "0 or 1"),
        "not finite": (_list_with(t, "rollout_logprobs", 1,
                                  [*logprobs[:at_one], float("nan"), *logprobs[at_one + 1:]]), "finite"),  # fmt: skip
        "untrained logprob": (_list_with(t, "rollout_logprobs", 1,
                                         [*logprobs[:at_zero], -0.5, *logprobs[at_zero + 1:]]), "where loss_mask is 0"),
        "null string": (_with(t, "status", pa.array(["completed", None, "completed"])), "status"),
        "metadata not an object": (_with(t, "metadata", pa.array(["{}", "[1]", "{}"])), "metadata"),
        "routing length": (_with(t, "routed_experts", pa.array([None, None, b"\x00" * 8], pa.large_binary())),
                           "routed_experts"),  # fmt: skip
        "column type": (_with(t, "sample_index", pa.array([0.0, 1.5, 0.0], pa.float64())), "sample_index"),
    }


@pytest.mark.parametrize("case", list(_damaged()))
def test_a_damaged_row_raises_what_sample_raises(case):
    table, match = _damaged()[case]
    with pytest.raises(ValidationError, match=match):
        table_to_samples(table)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")  # numpy on the null
def test_a_null_inside_a_token_list_is_never_built_unchecked():
    t = _table()
    tokens = t.column("tokens").to_pylist()
    tokens[0][0] = None
    damaged = _with(t, "tokens", pa.array(tokens, type=SAMPLE_SCHEMA.field("tokens").type))
    back = table_to_samples(damaged)  # what Sample makes of it (numpy's conversion), not a float array
    assert back[0].tokens.dtype == np.int32 and json.loads(damaged.column("metadata")[0].as_py()) == back[0].metadata


def test_a_checked_row_is_built_as_model_construct_builds_it():
    """The rows that pass are built by hand the way pydantic's model_construct builds them
    (its per-field alias lookups cost as much as validating): the same instance state."""
    from farm.trajectory.schema import _checked_sample

    for s in table_to_samples(_table()):
        row = {name: getattr(s, name) for name in reversed(Sample.model_fields)}
        ours, theirs = _checked_sample(row), Sample.model_construct(**row)
        assert list(ours.__dict__) == list(theirs.__dict__) == list(Sample.model_fields)
        assert ours.model_fields_set == theirs.model_fields_set and ours.model_dump_json() == theirs.model_dump_json()
        assert ours.__pydantic_extra__ == theirs.__pydantic_extra__ and ours.__pydantic_private__ == theirs.__pydantic_private__
