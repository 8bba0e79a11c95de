"""TRL: farm groups as ``GRPOTrainer``'s ``rollout_func``.

TRL (1.16) calls ``rollout_func(prompts, trainer)`` once per generation batch with this
process's slice of the dataset prompts, each already repeated ``num_generations`` times
(consecutive), and takes a dict with ``prompt_ids``, ``completion_ids`` and ``logprobs``
(one list per row), an optional ``env_mask`` (1 on model tokens, 0 on tokens the
environment added: TRL's tool mask, multiplied into the loss mask), and any other key
as a list per row that it copies into the reward functions' keyword arguments. It then
normalizes rewards over each ``num_generations`` consecutive rows.

So farm returns ``len(prompts) / num_generations`` groups of exactly ``num_generations``
rows, one per rollout: its **main chain** (``rows.main_row``): the response region of
a farm Sample, model turns and tool/template tokens between them, is the completion,
``loss_mask`` is ``env_mask`` and ``rollout_logprobs`` are ``logprobs``. Other chains
of a rollout (retries, sub-agents) do not fit TRL's fixed rows per group and are not
trained here (counted in ``FarmRolloutFunc.dropped_chains``); a group with another
number of rows (a rollout with no Samples) is skipped (``skipped_groups``). The dataset
prompts only set the batch size: farm's prompts are the groups' own.

Rewards travel as the ``farm_reward`` column: pass ``farm_reward`` (below) as the
reward function, or read ``farm_reward`` / ``farm_rollout_id`` / ``farm_group_id`` /
``farm_task_id`` / ``farm_chain_index`` in your own.

Several processes (``accelerate launch``): give each its own source of distinct groups
(e.g. a ``GroupReader`` per process: groups are then split by a hash of their id,
``shard=True``, the default for readers), so each process's slice is whole groups.
"""

from __future__ import annotations

from typing import Any

from farm.errors import IntegrationError
from farm.integrations.rows import main_row, rollouts_of
from farm.integrations.source import ReaderSource, as_group_source, shard_of
from farm.output.groups import Group

ROW_COLUMNS = ("farm_reward", "farm_rollout_id", "farm_group_id", "farm_task_id", "farm_chain_index")


def farm_reward(prompts: Any = None, completions: Any = None, farm_reward: list[float] | None = None,
                **kwargs: Any) -> list[float]:
    """A TRL reward function: the reward farm graded each row with."""
    if farm_reward is None:
        raise IntegrationError("farm_reward: no farm_reward column (is the rollout_func farm's?)")
    return [float(r) if r is not None else 0.0 for r in farm_reward]


class FarmRolloutFunc:
    """``GRPOTrainer(rollout_func=FarmRolloutFunc(source))``."""

    def __init__(self, source: Any, *, timeout: float | None = None, shard: bool | None = None) -> None:
        """``timeout``: how long one generation batch waits for its groups (None: no
        limit). ``shard``: keep only this process's share of the groups (by group id);
        default: when the source reads an output directory."""
        self.source = as_group_source(source)
        self.timeout = timeout
        self.shard = isinstance(self.source, ReaderSource) if shard is None else shard
        self.skipped_groups: list[str] = []
        self.dropped_chains = 0
        self.groups_used = 0

    def _groups(self, need: int, size: int, process: int, processes: int) -> list[list[Any]]:
        out: list[list[Any]] = []
        while len(out) < need:
            got = self.source.next_groups(need - len(out), timeout=self.timeout)
            if not got:
                raise IntegrationError(f"TRL needs {need} farm groups of {size} for this batch, got {len(out)} "
                                       f"(source exhausted, or timeout={self.timeout} s passed)")
            for g in got:
                if self.shard and processes > 1 and shard_of(g.group_id, processes) != process:
                    continue  # another process's group
                rows = self._rows(g)
                if len(rows) != size:
                    self.skipped_groups.append(g.group_id)
                    continue
                out.append(rows)
        self.groups_used += len(out)
        return out

    def _rows(self, group: Group) -> list[Any]:
        per_rollout = rollouts_of(group)
        self.dropped_chains += sum(len(c) - 1 for c in per_rollout)
        return [main_row(c) for c in per_rollout]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        training = trainer.model.training
        size = trainer.num_generations if training else trainer.num_generations_eval
        if len(prompts) % size:
            raise IntegrationError(f"TRL gave {len(prompts)} prompts, not a multiple of num_generations={size}: "
                                   "farm hands out whole groups")
        acc = getattr(trainer, "accelerator", None)
        process, processes = (acc.process_index, acc.num_processes) if acc is not None else (0, 1)
        rows = [s for g in self._groups(len(prompts) // size, size, process, processes) for s in g]
        return {
            "prompt_ids": [s.tokens[: s.prompt_length].tolist() for s in rows],
            "completion_ids": [s.response_tokens.tolist() for s in rows],
            "logprobs": [s.rollout_logprobs.tolist() for s in rows],
            "env_mask": [s.loss_mask.tolist() for s in rows],
            "farm_reward": [s.reward for s in rows],
            "farm_rollout_id": [s.rollout_id for s in rows],
            "farm_group_id": [s.group_id for s in rows],
            "farm_task_id": [s.task_id for s in rows],
            "farm_chain_index": [s.chain_index for s in rows],
        }


def prompt_dataset(num_prompts: int) -> Any:
    """A ``datasets.Dataset`` of placeholder prompts: GRPOTrainer needs a train dataset,
    whose length (with ``max_steps``) only sets how many batches it asks for."""
    # optional extra: datasets
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [f"farm group {i}" for i in range(num_prompts)]})
