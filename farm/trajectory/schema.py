"""The Sample: one linearized chain of one rollout = one training row.

One pydantic model (``Sample``, numpy-backed token columns, invariants checked on
construction) and its Arrow schema (``SAMPLE_SCHEMA``, derived from it as the output
directory's other tables' are: ``farm.trajectory.row_schema``); ``samples_to_table`` /
``table_to_samples`` convert between them in O(total tokens) without per-token
Python work. ``to_slime_dict`` / ``from_slime_dict`` give a slime-style ``Sample``
dict and back, losslessly (farm's extra columns travel in ``metadata["farm"]``).

Regions (as slime does for multi-turn): ``tokens[:prompt_length]`` is the chain's
first prompt; everything after is the *response* region, which also holds template,
tool-result and user tokens of later turns (``loss_mask`` 0 there).
``loss_mask`` and ``rollout_logprobs`` cover exactly the response region.
"""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

from farm.errors import TrajectoryError
from farm.trajectory.row_schema import Arrow, arrow_schema
from farm.trajectory.table_checks import nonzero_where_untrained, scalar_rules, table_passes
from farm.status import RolloutStatus


def _array(dtype: type, value_type: pa.DataType) -> Any:
    """A 1-D numpy array of ``dtype`` (converted on construction), a list of ``value_type`` in Arrow."""

    def conv(v: Any) -> np.ndarray:
        arr = np.asarray(v, dtype=dtype)
        if arr.ndim != 1:
            raise ValueError(f"expected a 1-D sequence, got shape {arr.shape}")
        return arr

    return Annotated[np.ndarray, BeforeValidator(conv), PlainSerializer(lambda a: a.tolist(), return_type=list),
                     Arrow(pa.list_(value_type))]  # fmt: skip


Int32Array = _array(np.int32, pa.int32())
UInt8Array = _array(np.uint8, pa.uint8())
Float32Array = _array(np.float32, pa.float32())
Int32 = Annotated[int, Arrow(pa.int32())]

# Version 2 (this one): ``group_index`` (the group's place in the run's task stream)
# and ``policy_version_min``/``policy_version_max`` (weight versions of the Sample's
# trained turns) replace version 1's ``policy_version`` (which was the minimum).
# Migration rule: columns are only ever added or replaced, never re-typed; a reader
# upgrades an older table on the fly (``migrate_table``), filling what the old version
# did not have with null (``policy_version`` -> both new columns).
SCHEMA_VERSION = 2

_LIST_COLS = {"tokens": np.int32, "loss_mask": np.uint8, "rollout_logprobs": np.float32}

# the integer columns' ranges, declared on the model: a Sample that constructs converts to
# its Arrow row, so a commit's one table for many rollouts cannot fail on one rollout's value
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


class Sample(BaseModel):
    """One training row. Construction validates every length/value invariant. Its fields are
    the Samples table's columns, in their order (``SAMPLE_SCHEMA`` is derived from them): a
    column takes nulls where its field takes None; never re-type one, add new ones at the end
    (see ``SCHEMA_VERSION``)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, frozen=True)

    run_id: str = ""
    task_id: str = ""
    rollout_id: str
    group_id: str = ""
    sample_index: Int32 = Field(default=0, ge=0, le=INT32_MAX, description="index of the rollout in its group")
    chain_index: Int32 = Field(default=0, ge=0, le=INT32_MAX, description="index of the chain in its rollout (DFS order)")
    chain_kind: str = Field(default="main", description="main | retry | branch | fork | side")
    session_id: str = ""
    harness: str = ""
    model: str = ""
    group_index: int | None = Field(default=None, ge=-INT64_MAX, le=INT64_MAX, description="the group's position in the run's task stream")
    policy_version_min: int | None = Field(default=None, ge=-INT64_MAX, le=INT64_MAX, description="oldest weight version of a trained turn")
    policy_version_max: int | None = Field(default=None, ge=-INT64_MAX, le=INT64_MAX, description="newest weight version of a trained turn")
    tokens: Int32Array
    prompt_length: Int32 = Field(ge=0, le=INT32_MAX)
    response_length: Int32 = Field(ge=0, le=INT32_MAX)
    loss_mask: UInt8Array
    rollout_logprobs: Float32Array
    reward: float | None = None
    status: str = "completed"
    finish_reason: str = "stop"
    num_turns: Int32 = Field(default=1, ge=0, le=INT32_MAX)
    metadata: Annotated[dict[str, Any], Arrow(pa.string())] = Field(default_factory=dict)  # a JSON object
    # MoE routing replay (engine.routed_experts: on): the experts of positions [0, len(tokens) - 1),
    # raw C-order [positions, layers, top_k] bytes; dtype/layers/top_k in metadata["routed_experts"]
    routed_experts: Annotated[Any, PlainSerializer(lambda a: None if a is None else a.tolist()),
                              Arrow(pa.large_binary(), nullable=True)] = Field(
        default=None, description="[len(tokens) - 1, layers, top_k] expert ids (uint8 / uint16), or None"
    )  # fmt: skip

    @model_validator(mode="after")
    def _invariants(self) -> Sample:
        n, p, r = len(self.tokens), self.prompt_length, self.response_length
        if p + r != n:
            raise ValueError(f"prompt_length {p} + response_length {r} != {n} tokens")
        if len(self.loss_mask) != r:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for response_length {r}")
        if len(self.rollout_logprobs) != r:
            raise ValueError(f"rollout_logprobs has {len(self.rollout_logprobs)} entries for response_length {r}")
        if r and int(self.loss_mask.max()) > 1:
            raise ValueError("loss_mask values must be 0 or 1")
        # a float64 sum is non-finite iff some float32 logprob is (it cannot overflow)
        if r and not np.isfinite(self.rollout_logprobs.sum(dtype=np.float64)):
            raise ValueError("rollout_logprobs must be finite")
        if r and nonzero_where_untrained(self.loss_mask, self.rollout_logprobs):
            raise ValueError("rollout_logprobs must be 0.0 where loss_mask is 0")
        re = self.routed_experts
        if re is not None:
            if not isinstance(re, np.ndarray) or re.ndim != 3 or len(re) != max(0, n - 1):
                shape = getattr(re, "shape", None)
                raise ValueError(f"routed_experts must be [len(tokens) - 1 = {max(0, n - 1)}, layers, top_k], "
                                 f"got {shape}")
        return self

    @property
    def num_trained_tokens(self) -> int:
        return int(self.loss_mask.sum(dtype=np.int64))

    @property
    def response_tokens(self) -> np.ndarray:
        return self.tokens[self.prompt_length :]


SAMPLE_SCHEMA = arrow_schema(Sample, strict_nulls=True, metadata={
    b"farm.table": b"samples", b"farm.schema_version": str(SCHEMA_VERSION).encode()})
_SCALAR_COLS = [f.name for f in SAMPLE_SCHEMA if f.name not in _LIST_COLS and f.name not in ("metadata", "routed_experts")]


def _list_array(arrays: Sequence[np.ndarray], dtype: type, pa_type: pa.DataType) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if len(arrays) == 1:  # no copy: Arrow wraps the numpy buffer
        values = np.asarray(arrays[0], dtype=dtype)
    else:
        values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa_type))


def sample_metadata_json(sample: Sample) -> str:
    """The ``metadata`` column's value of ``sample`` (JSON; raises if it is not encodable)."""
    return json.dumps(_with_routing_meta(sample))


def samples_to_table(samples: Sequence[Sample], metadata: Sequence[str] | None = None) -> pa.Table:
    """Samples -> one Arrow table with ``SAMPLE_SCHEMA``. ``metadata``: each Sample's
    ``sample_metadata_json``, when the caller encoded it already."""
    cols: dict[str, pa.Array] = {}
    for name in _SCALAR_COLS:
        cols[name] = pa.array([getattr(s, name) for s in samples], type=SAMPLE_SCHEMA.field(name).type)
    for name, dtype in _LIST_COLS.items():
        cols[name] = _list_array([getattr(s, name) for s in samples], dtype, SAMPLE_SCHEMA.field(name).type.value_type)
    if metadata is None:
        metadata = [sample_metadata_json(s) for s in samples]
    cols["metadata"] = pa.array(metadata, type=pa.string())
    cols["routed_experts"] = pa.array(
        [None if s.routed_experts is None else np.ascontiguousarray(s.routed_experts).tobytes() for s in samples],
        type=pa.large_binary())
    return pa.Table.from_arrays([cols[f.name] for f in SAMPLE_SCHEMA], schema=SAMPLE_SCHEMA)


def table_to_samples(table: pa.Table | pa.RecordBatch) -> list[Sample]:
    """Arrow rows -> Samples (token columns are zero-copy numpy views where possible)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    table = migrate_table(table)
    missing = [f.name for f in SAMPLE_SCHEMA if f.name not in table.column_names]
    if missing:
        raise TrajectoryError(f"not a Sample table: missing columns {missing}")
    table = table.select([f.name for f in SAMPLE_SCHEMA]).combine_chunks()
    lists: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in _LIST_COLS:
        col = table.column(name).chunk(0) if table.num_rows else None
        if col is None:
            continue
        lists[name] = (col.offsets.to_numpy(), col.values.to_numpy(zero_copy_only=False))
    # every row checked column-wise at once: those that pass are built without pydantic's
    # per-row validation (farm.trajectory.table_checks), any other raises what Sample raises
    checked = table_passes(table, SAMPLE_SCHEMA, _scalar_rules(), lists, _LIST_COLS)
    scalars = {name: table.column(name).to_pylist() for name in _SCALAR_COLS}
    metas = table.column("metadata").to_pylist()
    routed = table.column("routed_experts").to_pylist()
    out = []
    for i in range(table.num_rows):
        row: dict[str, Any] = {name: scalars[name][i] for name in _SCALAR_COLS}
        for name, (offs, vals) in lists.items():
            row[name] = vals[offs[i] : offs[i + 1]]
        row["metadata"] = meta = json.loads(metas[i])
        row["routed_experts"] = re = _routing_from(routed[i], meta)
        n = len(row["tokens"])
        if checked and type(meta) is dict and (re is None or (re.ndim == 3 and len(re) == max(0, n - 1))):
            out.append(_checked_sample(row))
        else:
            out.append(Sample(**row))
    return out


@functools.cache
def _scalar_rules() -> dict[str, tuple[bool, Any, Any]]:
    return scalar_rules(Sample, _SCALAR_COLS)


def _checked_sample(row: dict[str, Any]) -> Sample:
    """A Sample from a row ``table_passes`` checked (every field given): what
    ``Sample.model_construct(**row)`` makes (``__dict__`` and the fields set, as it sets
    them), without its per-field alias lookups, which cost as much as validating."""
    sample = Sample.__new__(Sample)
    object.__setattr__(sample, "__dict__", {name: row[name] for name in _FIELD_NAMES})
    object.__setattr__(sample, "__pydantic_fields_set__", set(_FIELD_NAMES))
    object.__setattr__(sample, "__pydantic_extra__", None)
    object.__setattr__(sample, "__pydantic_private__", None)
    return sample


_FIELD_NAMES = tuple(Sample.model_fields)
# _checked_sample is model_construct only for a model without aliases, post-init or extras
assert not any(f.alias or f.validation_alias for f in Sample.model_fields.values())
assert not Sample.__pydantic_post_init__ and Sample.model_config.get("extra") == "forbid"


def _with_routing_meta(s: Sample) -> dict[str, Any]:
    if s.routed_experts is None:
        return s.metadata
    re = s.routed_experts
    info = dict(s.metadata.get("routed_experts") or {})
    info.update(layers=int(re.shape[1]), top_k=int(re.shape[2]), dtype=str(re.dtype))
    return {**s.metadata, "routed_experts": info}


def _routing_from(raw: bytes | None, meta: dict[str, Any]) -> np.ndarray | None:
    if raw is None:
        return None
    info = meta.get("routed_experts") or {}
    arr = np.frombuffer(raw, dtype=np.dtype(info.get("dtype", "uint8")))
    return arr.reshape(-1, int(info["layers"]), int(info["top_k"]))


def migrate_table(table: pa.Table) -> pa.Table:
    """An older Samples table in the current schema's shape (see ``SCHEMA_VERSION``)."""
    names = table.column_names
    if "policy_version" in names and "policy_version_min" not in names:  # version 1
        old = table.column("policy_version").cast(pa.int64())
        table = table.drop_columns(["policy_version"])
        table = table.append_column("policy_version_min", old).append_column("policy_version_max", old)
        names = table.column_names
    if "group_index" not in names and "tokens" in names:
        table = table.append_column("group_index", pa.nulls(table.num_rows, pa.int64()))
    if "routed_experts" not in table.column_names and "tokens" in names:
        table = table.append_column(pa.field("routed_experts", pa.large_binary()),
                                    pa.nulls(table.num_rows, pa.large_binary()))
    if table.schema.metadata != SAMPLE_SCHEMA.metadata and set(SAMPLE_SCHEMA.names) <= set(table.column_names):
        # an upgraded table reads as the current version, columns in the current order
        table = table.select(SAMPLE_SCHEMA.names).replace_schema_metadata(SAMPLE_SCHEMA.metadata)
    return table


# ---- slime ---------------------------------------------------------------------
_SLIME_STATUS = {"stop": "completed", "length": "truncated", "abort": "aborted", "error": "failed"}
_FARM_COLUMNS = {"run_id", "task_id", "rollout_id", "group_id", "sample_index", "chain_index", "chain_kind", "harness",
                 "model", "group_index", "policy_version_min", "policy_version_max", "prompt_length", "status",
                 "finish_reason", "num_turns"}  # fmt: skip


def slime_status(sample: Sample) -> str:
    """slime's ``Sample.Status`` value: the rollout's status first (a Sample of a rollout
    that is not a trainable outcome is ``failed`` whatever its last turn said; one whose
    policy ran out of a budget is ``truncated``), then how the chain's last turn ended."""
    try:
        trainable = RolloutStatus(sample.status).trainable
    except ValueError:
        trainable = False
    if not trainable:
        return "failed"
    if sample.status == RolloutStatus.TRUNCATED.value:  # the policy ran out of a budget, whatever its last turn
        return "truncated"
    return _SLIME_STATUS.get(sample.finish_reason, "completed")


def stable_index(sample: Sample) -> int:
    """A deterministic non-negative int64 unique per (rollout, chain) with overwhelming
    probability: slime's ``index`` when the caller has no running counter."""
    # heavy: xxhash
    import xxhash

    return xxhash.xxh3_64_intdigest(f"{sample.rollout_id}\x00{sample.chain_index}".encode()) >> 1


def to_slime_dict(sample: Sample, tokenizer: Any = None, *, index: int | None = None) -> dict[str, Any]:
    """A dict in the shape of ``slime.utils.types.Sample.to_dict()``.

    slime's own fields are filled from ours; every farm column that slime lacks is
    kept under ``metadata["farm"]`` so ``from_slime_dict`` restores the Sample
    exactly. ``group_index`` is the group's position in the run's task stream (an int,
    whatever the task id); ``index`` is the caller's running counter if given, else
    ``stable_index``. ``prompt``/``response`` text is decoded only if a tokenizer is given.
    """
    farm = sample.model_dump(include=_FARM_COLUMNS)
    metadata = dict(sample.metadata)
    metadata["farm"] = farm
    prompt = response = ""
    if tokenizer is not None:
        prompt = tokenizer.decode(sample.tokens[: sample.prompt_length].tolist(), skip_special_tokens=False)
        response = tokenizer.decode(sample.response_tokens.tolist(), skip_special_tokens=False)
    return {
        "group_index": sample.group_index,
        "index": stable_index(sample) if index is None else index,
        "prompt": prompt,
        "tokens": sample.tokens.tolist(),
        "response": response,
        "response_length": sample.response_length,
        "label": None,
        "reward": sample.reward,
        "loss_mask": sample.loss_mask.tolist(),
        "weight_versions": [str(v) for v in metadata.get("policy_versions", [])],
        "rollout_log_probs": sample.rollout_logprobs.tolist(),
        # slime's own form: int32 [len(tokens) - 1, layers, top_k] (what its rollout decodes from SGLang)
        "rollout_routed_experts": None if sample.routed_experts is None else sample.routed_experts.astype(np.int32),
        "remove_sample": False,
        "status": slime_status(sample),
        "metadata": metadata,
        "session_id": sample.session_id,
    }


def from_slime_dict(data: Mapping[str, Any]) -> Sample:
    """Inverse of ``to_slime_dict`` (also accepts plain slime dicts without farm fields)."""
    metadata = dict(data.get("metadata") or {})
    farm = dict(metadata.pop("farm", {}))
    tokens = data["tokens"]
    r = int(data["response_length"])
    farm.setdefault("prompt_length", len(tokens) - r)
    farm.setdefault("rollout_id", str(data.get("index", "")))
    farm.setdefault("finish_reason", {v: k for k, v in _SLIME_STATUS.items()}.get(str(data.get("status")), "stop"))
    mask = np.asarray(data["loss_mask"] if data.get("loss_mask") is not None else [1] * r, dtype=np.uint8)
    logprobs = np.asarray(data.get("rollout_log_probs") or [0.0] * r, dtype=np.float32)
    if len(logprobs) == len(mask):  # plain slime may keep logprobs under loss_mask 0: farm zeroes them
        logprobs = np.where(mask == 1, logprobs, np.float32(0.0)).astype(np.float32)
    routed = data.get("rollout_routed_experts")
    if routed is not None:
        info = metadata.get("routed_experts") or {}
        routed = np.asarray(routed)
        dtype = info.get("dtype") or ("uint8" if routed.size == 0 or int(routed.max()) < 256 else "uint16")
        routed = routed.astype(dtype)
    return Sample(
        **farm,
        routed_experts=routed,
        session_id=data.get("session_id") or "",
        tokens=tokens,
        response_length=r,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        reward=data.get("reward"),
        metadata=metadata,
    )
