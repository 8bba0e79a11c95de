"""Grading section: what a reward-hack finding does to the reward (``farm.grading.hacks``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HackAction = Literal["flag", "zero_reward", "exclude"]


class GradingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    probe: bool = Field(
        default=True,
        description="load farm's pytest probe into the test run, under farm's witness (signed results + runtime checks)",
    )
    on_hack: HackAction = Field(
        default="zero_reward", description="runtime findings (the probe's): flag | zero_reward | exclude"
    )
    on_static_hack: HackAction = Field(default="flag", description="static findings (the diff's): same choices")
    judge: str | None = Field(
        default=None,
        description="optional 'module:callable' reviewing each graded diff: called with (task, diff, report), "
        "returns None (fine) or a short finding, recorded as flag 'judge:<finding>' (acts like on_static_hack)",
    )
