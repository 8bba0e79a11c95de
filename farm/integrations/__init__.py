"""Trainer adapters: farm's done groups in the shape each trainer takes.

One module per trainer, each importing its trainer only when used (none is a farm
dependency): ``slime`` (a ``--rollout-function-path`` function), ``verl``
(``AgentLoopOutput``), ``trl`` (``GRPOTrainer``'s ``rollout_func``), ``openrlhf`` (an
agent executor's result), ``pytorch`` (a group-level ``IterableDataset``; the row-level
one is ``farm.output.torch_data``). All of them take groups from a *group source*
(``source``: a ``farm.Farm``, a ``GroupReader``, or any iterable of groups) and map a
rollout's chains to rows the same way (``rows``).
"""

from farm.integrations.source import GroupSource, as_group_source, iter_groups

__all__ = ["GroupSource", "as_group_source", "iter_groups"]
