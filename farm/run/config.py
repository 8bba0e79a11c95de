"""The run session's configuration (the config layer: imports only pydantic)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamConfig(BaseModel):
    """How the run's tasks become a stream of groups (``stream:`` in the run config)."""

    model_config = ConfigDict(extra="forbid")

    epochs: int | None = Field(default=1, ge=1, description="passes over the task set; None = until stopped")
    shuffle: bool = Field(default=False, description="a new seeded order each epoch")
    seed: int = Field(default=0, description="shuffle seed (epoch e uses seed + e)")
    curriculum: str | None = Field(
        default=None, description="'module:function' (epoch, tasks, rewards by task id) -> that epoch's tasks"
    )
    max_ahead: int = Field(
        default=64, ge=1,
        description="farm.Farm: rollouts dispatched but not yet handed to the trainer (back-pressure); "
        "at least one group is always allowed",
    )
    max_staleness: int | None = Field(
        default=None, ge=0,
        description="weight versions a rollout may lag behind the current policy when it is recorded; None = no bound",
    )
    on_stale: Literal["keep", "drop", "abort"] = Field(
        default="keep",
        description="a rollout beyond max_staleness: 'keep' (recorded, versions stamped), 'drop' (finished, not "
        "recorded, run again under the current policy), 'abort' (cancelled at the weight update, run again)",
    )
    max_stale_reruns: int = Field(
        default=3, ge=0, description="reruns of a rollout dropped or aborted as stale; then it is recorded as stale"
    )

    def too_stale(self, oldest: int | None, current: int, stage: Literal["running", "recorded", "handed_out"]) -> bool:
        """The one staleness rule: whether work whose oldest turn was generated under weight
        version ``oldest`` is beyond ``max_staleness`` at ``current``, *and* ``on_stale`` acts at
        ``stage``: a running rollout is aborted ('abort'), a finished one not recorded ('drop'),
        a recorded group not handed to the trainer (either: only 'keep' trains on it)."""
        acts = {"running": ("abort",), "recorded": ("drop",), "handed_out": ("drop", "abort")}[stage]
        return (self.on_stale in acts and self.max_staleness is not None and oldest is not None
                and current - oldest > self.max_staleness)
