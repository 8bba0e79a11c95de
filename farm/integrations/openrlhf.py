"""OpenRLHF: farm Samples as the result of an OpenRLHF agent executor.

OpenRLHF (``--train.agent_func_path agent.py``, a file defining ``AgentExecutor``, a
subclass of ``openrlhf.utils.agent.AgentExecutorBase``) calls
``await executor.execute(prompt, label, sampling_params, max_length, hf_tokenizer,
llm_engine, images=None)`` ``n_samples_per_prompt`` times per dataset prompt and turns
each returned dict into one ``Experience`` (``SamplesGenerator._process_response_into_experience``):

- ``observation_tokens``: the whole sequence (prompt, model turns, environment feedback);
- ``action_ranges``: ``[(start, end)]`` spans of model-generated tokens in it (the
  action mask; everything else is context);
- ``rollout_log_probs``: one per token of ``observation_tokens`` (0.0 off the actions),
  shifted by one there (``[1:]``) to align with the action mask;
- ``reward`` (advantages), ``scores`` (dynamic filtering), ``truncated``,
  ``extra_logs`` (numeric: each becomes a tensor in ``Experience.info``), and
  ``prompt``, ``label``, ``images``, ``mm_train_inputs`` echoed.

A farm Sample maps onto it directly: ``tokens`` are the observation tokens, the runs of
``loss_mask`` 1 (offset by ``prompt_length``) are the action ranges, and the logprobs
are ``rollout_logprobs`` behind ``prompt_length`` zeros. The sequence is truncated to
OpenRLHF's ``max_len`` by OpenRLHF itself; farm does not cut it.

OpenRLHF normalizes rewards over each ``n_samples_per_prompt`` consecutive experiences,
so ``FarmAgentExecutor`` returns one per rollout, its main chain, and the n executes
of one prompt receive the n rollouts of one farm group (the other chains of a rollout
are not trained here: ``dropped_chains``). ``group_to_agent_outputs(chains="all")``
gives every chain for your own experience maker.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from farm.errors import IntegrationError
from farm.integrations.rows import ChainPolicy, main_row, rollouts_of, rows_of
from farm.integrations.source import as_group_source
from farm.output.groups import Group
from farm.trajectory.schema import Sample


def action_ranges(sample: Sample) -> list[tuple[int, int]]:
    """Half-open spans of ``sample.tokens`` where ``loss_mask`` is 1."""
    mask = np.concatenate([[0], sample.loss_mask.astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(mask))
    p = sample.prompt_length
    return [(int(a) + p, int(b) + p) for a, b in zip(edges[::2], edges[1::2])]


def to_agent_output(sample: Sample, *, prompt: Any = None, label: Any = None) -> dict[str, Any]:
    """One Sample as the dict an OpenRLHF ``AgentExecutor.execute`` returns."""
    logprobs = np.zeros(len(sample.tokens), dtype=np.float64)
    logprobs[sample.prompt_length :] = sample.rollout_logprobs
    numeric = {"farm_chain_index": sample.chain_index, "farm_sample_index": sample.sample_index,
               "farm_num_turns": sample.num_turns}  # fmt: skip
    if sample.group_index is not None:
        numeric["farm_group_index"] = sample.group_index
    if sample.policy_version_min is not None:
        numeric["farm_policy_version_min"] = sample.policy_version_min
    return {
        "prompt": prompt if prompt is not None else sample.task_id,
        "label": label if label is not None else sample.rollout_id,
        "images": None,
        "mm_train_inputs": None,
        "observation_tokens": sample.tokens.tolist(),
        "action_ranges": action_ranges(sample),
        "rollout_log_probs": logprobs.tolist(),
        "reward": sample.reward,
        "scores": sample.reward,
        "truncated": sample.finish_reason == "length",
        "extra_logs": numeric,
    }


def group_to_agent_outputs(group: Group, *, chains: ChainPolicy = "main") -> list[dict[str, Any]]:
    """The group's rows as executor results (``chains="main"``: one per rollout, the
    shape OpenRLHF's per-prompt normalization needs)."""
    return [to_agent_output(s) for s in rows_of(group, chains)]


def _executor_base() -> type:
    try:
        # optional: openrlhf
        from openrlhf.utils.agent import AgentExecutorBase
    except ImportError:
        return object
    return AgentExecutorBase


class FarmAgentExecutor(_executor_base()):  # type: ignore[misc]
    """An OpenRLHF ``AgentExecutor`` that serves farm rollouts instead of generating.

    Each ``execute`` returns the next rollout of the current farm group, so the n calls
    for one prompt (``n_samples_per_prompt`` = the farm run's ``rollout.n_samples``)
    get one group's n rollouts. The calls take their rows in the order they ask
    (an ``asyncio.Lock`` is FIFO), which is the order OpenRLHF starts them in.
    In ``agent.py``: ``class AgentExecutor(FarmAgentExecutor): def __init__(self):
    super().__init__(GroupReader("/runs/x", order="task"))``.
    """

    def __init__(self, source: Any, *, timeout: float | None = None) -> None:
        self.source = as_group_source(source)
        self.timeout = timeout
        self._rows: list[Sample] = []
        self._lock: asyncio.Lock | None = None
        self.dropped_chains = 0
        self.groups_used = 0
        self.skipped_groups: list[str] = []  # a rollout without Samples: fewer rows than the group's size

    def _next_group_rows(self) -> list[Sample]:
        while True:
            got = self.source.next_groups(1, timeout=self.timeout)
            if not got:
                raise IntegrationError(f"no farm group (source exhausted, or timeout={self.timeout} s passed)")
            per_rollout = rollouts_of(got[0])
            if len(per_rollout) == got[0].size:  # else the n rows of a prompt would straddle two groups
                break
            self.skipped_groups.append(got[0].group_id)
        self.dropped_chains += sum(len(c) - 1 for c in per_rollout)
        self.groups_used += 1
        return [main_row(c) for c in per_rollout]

    async def execute(self, prompt: Any, label: Any, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                      llm_engine: Any, images: Any = None) -> dict[str, Any]:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if not self._rows:
                # polling an output directory blocks: off the engine actor's event loop
                self._rows = await asyncio.to_thread(self._next_group_rows)
            sample = self._rows.pop(0)
        return to_agent_output(sample, prompt=prompt, label=label)
