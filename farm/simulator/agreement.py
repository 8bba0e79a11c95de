"""Do the engine's logprobs agree with the trainer's? (``train_rollout_logprob_diff``)

The check the anchors run on GPUs (slime's ``train_rollout_logprob_abs_diff``, verl's
rollout/actor probability difference): recompute, with the weights each turn was
generated with, the logprob of every trained token (``loss_mask`` 1) of every Sample
and compare it with the ``rollout_logprobs`` the engine returned. With the same model
and kernels the difference is float noise; any misalignment of tokens, mask or
positions makes it large (a token scored in the wrong context, or the wrong token).

A Sample's trained tokens are its trained turns' outputs, in order, each a contiguous
run of ``loss_mask`` (turns are separated by prompt-side tokens), and
``metadata["policy_versions"]`` has one version per trained turn: run ``i`` is scored
with the weights of version ``i``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from farm.trajectory.schema import Sample


@dataclass(frozen=True)
class LogprobAgreement:
    """max / mean |trainer logprob - rollout logprob| over ``tokens`` trained tokens of ``samples`` Samples."""

    max_abs: float
    mean_abs: float
    tokens: int
    samples: int

    def line(self) -> str:
        return f"train_rollout_logprob_diff={self.max_abs:.3g} train_rollout_logprob_diff_mean={self.mean_abs:.3g}"


def trained_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``[(start, end)]`` of the runs of 1 in a loss mask (response-relative)."""
    m = np.concatenate([[0], np.asarray(mask, dtype=np.int8), [0]])
    edges = np.flatnonzero(np.diff(m))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def turn_versions(sample: Sample) -> list[tuple[int, int, int | None]]:
    """``[(start, end, version)]`` per trained turn, response-relative."""
    runs = trained_runs(sample.loss_mask)
    versions = list(sample.metadata.get("policy_versions") or [])
    if len(versions) == len(runs):
        return [(a, b, v) for (a, b), v in zip(runs, versions)]
    if sample.policy_version_min == sample.policy_version_max:  # one version (or none) for all of it
        return [(a, b, sample.policy_version_min) for a, b in runs]
    raise ValueError(f"Sample {sample.rollout_id}#{sample.chain_index}: {len(runs)} trained runs but "
                     f"{len(versions)} policy versions")


def sample_diffs(sample: Sample, model_for: Callable[[int | None], Any], temperature: float = 1.0) -> np.ndarray:
    """|trainer - rollout| logprob of each trained token of one Sample, in order."""
    # optional extra: torch
    import torch

    # heavy: huggingface_hub, jinja2, numpy
    from farm.simulator.lm import token_logprobs

    out = []
    for a, b, version in turn_versions(sample):
        positions = np.arange(a, b) + sample.prompt_length
        with torch.inference_mode():
            mine = token_logprobs(model_for(version), sample.tokens.astype(np.int64), positions, temperature).numpy()
        out.append(np.abs(mine.astype(np.float64) - sample.rollout_logprobs[a:b].astype(np.float64)))
    return np.concatenate(out) if out else np.zeros(0)


def logprob_agreement(samples: Iterable[Sample], model_for: Callable[[int | None], Any],
                      temperature: float = 1.0) -> LogprobAgreement:
    """The agreement over every trained token of ``samples``; ``model_for(version)``
    gives the model (``farm.simulator.lm.TinyLM``) holding that version's weights."""
    diffs, n = [], 0
    for s in samples:
        diffs.append(sample_diffs(s, model_for, temperature))
        n += 1
    d = np.concatenate(diffs) if diffs else np.zeros(0)
    return LogprobAgreement(max_abs=float(d.max()) if d.size else 0.0, mean_abs=float(d.mean()) if d.size else 0.0,
                            tokens=int(d.size), samples=n)


class ModelsByVersion:
    """``model_for(version)`` over checkpoint directories (version -> path), loaded once each."""

    def __init__(self, paths: dict[int, str] | None = None) -> None:
        self.paths: dict[int, str] = dict(paths or {})
        self._loaded: dict[int, Any] = {}

    def add(self, version: int, path: str) -> None:
        self.paths[version] = str(path)
        self._loaded.pop(version, None)

    def __call__(self, version: int | None) -> Any:
        # heavy: huggingface_hub, jinja2, numpy
        from farm.simulator.lm import load_model

        if version is None or version not in self.paths:
            raise KeyError(f"no checkpoint for policy version {version} (known: {sorted(self.paths)})")
        if version not in self._loaded:
            self._loaded[version] = load_model(self.paths[version])
        return self._loaded[version]
