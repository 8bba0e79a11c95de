"""Routed experts (MoE routing replay, "R3"): SGLang's wire format, farm's compact form,
and the scripted engine's deterministic fake MoE.

Wire (SGLang ``--enable-return-routed-experts``; a ``/generate`` request sets
``return_routed_experts: true`` and ``routed_experts_start_len: S``): the reply's
``meta_info.routed_experts`` is base64 of a little-endian int32 C-order array of shape
``[seqlen - 1 - S, layers, top_k]``, ``seqlen`` = prompt + output tokens. Row ``i`` is
the experts chosen at absolute position ``S + i``, i.e. while the model processed the
token at that position; the last output token is never fed forward, so it has no row.
``S`` must lie in ``[0, prompt tokens]``; 0 asks for the whole sequence.

farm keeps expert ids as uint8 when the model has at most 256 experts, uint16 otherwise.
"""

from __future__ import annotations

import base64
from math import gcd

import numpy as np

from farm.engine.config import MoEShape  # a config type (engine.moe, routed_experts); here for the codec's users
from farm.errors import EngineError


def encode_routed(rows: np.ndarray) -> str:
    """``[rows, layers, top_k]`` ids -> SGLang's base64 int32 payload."""
    return base64.b64encode(np.ascontiguousarray(rows, dtype="<i4").tobytes()).decode("ascii")


def decode_routed(payload: str, rows: int, shape: MoEShape) -> np.ndarray:
    """SGLang's payload -> ``[rows, layers, top_k]`` in farm's compact dtype; ``EngineError``
    when the payload does not have exactly that shape or names an expert out of range."""
    try:
        raw = base64.b64decode(payload.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise EngineError(f"routed_experts is not base64: {exc}") from exc
    if len(raw) % 4:
        raise EngineError(f"routed_experts: {len(raw)} bytes is not a whole number of int32 values")
    ids = np.frombuffer(raw, dtype="<i4")
    want = rows * shape.per_token
    if ids.size != want:
        got_rows = ids.size / shape.per_token
        raise EngineError(
            f"routed_experts has {ids.size} ids, expected {rows} positions x {shape.layers} layers x "
            f"{shape.top_k} top_k = {want} ({got_rows:g} positions at this shape): the engine's model is "
            "not the configured MoE (engine.moe), or the positions differ"
        )
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= shape.experts):
        raise EngineError(f"routed_experts names expert {int(ids.max())} (or {int(ids.min())}); "
                          f"the model has {shape.experts} experts")
    return ids.astype(shape.dtype).reshape(rows, shape.layers, shape.top_k)


# --- the scripted engine's fake MoE ---------------------------------------------------
_MIX = np.uint64(0x9E3779B97F4A7C15)


def fake_routing(tokens: np.ndarray, start: int, end: int, shape: MoEShape) -> np.ndarray:
    """Deterministic experts for positions ``[start, end)`` of ``tokens``: a function of the
    token, its position, the layer and the whole prefix (a cumulative hash), so a changed
    earlier token changes every later routing, and a shift by one position shows.
    ``[end - start, layers, top_k]`` int32, top_k distinct experts per layer."""
    t = np.asarray(tokens[:end], dtype=np.uint64)
    pos = np.arange(len(t), dtype=np.uint64)
    with np.errstate(over="ignore"):
        prefix = np.cumsum((t + np.uint64(1)) * (pos * np.uint64(2) + np.uint64(1)) * _MIX, dtype=np.uint64)
        h = prefix[start:end, None] ^ (t[start:end, None] * np.uint64(0xBF58476D1CE4E5B9))
        layer = np.arange(shape.layers, dtype=np.uint64)[None, :] * np.uint64(0x94D049BB133111EB)
        h = (h + layer) * _MIX
        h ^= h >> np.uint64(29)
    first = (h % np.uint64(shape.experts)).astype(np.int64)  # [n, layers]
    # top_k distinct experts: first + j * stride (mod experts) with a stride coprime to it
    stride = _coprime_stride(shape.experts)
    k = np.arange(shape.top_k, dtype=np.int64)[None, None, :] * stride
    return ((first[:, :, None] + k) % shape.experts).astype(np.int32)


def _coprime_stride(n: int) -> int:
    s = max(1, n // 2 + 1)
    while gcd(s, n) != 1:
        s += 1
    return s
