"""The records of one rollout: what to run (RolloutSpec) and what came out
(RolloutResult), which makes its own row of the rollouts table and the small summary the
driver sees (both declared with the output directory: ``farm.output.rows``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from farm.gateway.endpoints import RolloutMode
from farm.grading.config import HackAction
from farm.output import rows
from farm.rollout.outcome import Ending, outcome_for_ending
from farm.rollout.retry import Reruns
from farm.status import Outcome, RetryKind, RolloutStatus
from farm.tasks.model import Task


def make_rollout_id(task_id: str, sample_index: int) -> str:
    """Stable across reruns (resume depends on it): the sample index after the last dot."""
    return f"{task_id}.{sample_index}"


class RolloutSpec(BaseModel):
    """One attempt to run one task once."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    rollout_id: str
    group_id: str = Field(description="rollouts of the same task form one GRPO group")
    sample_index: int = Field(ge=0)
    task: Task
    attempt: int = Field(default=1, ge=1, description="dispatch attempt: 1 + every rerun, of any kind")
    reruns: Reruns = Field(default_factory=Reruns, description="reruns spent so far, per kind (farm.rollout.retry)")
    group_index: int | None = Field(default=None, ge=0, description="the group's position in the run's task stream")
    epoch: int = Field(default=0, ge=0, description="pass over the task set this rollout belongs to")

    def next(self, kind: RetryKind) -> RolloutSpec:
        """The next attempt of this rollout, run again as ``kind`` (spends that kind's budget only)."""
        return self.model_copy(update={"attempt": self.attempt + 1, "reruns": self.reruns.after(kind)})

    def interrupted(self, actor: str = "") -> rows.RolloutSummary:
        """The summary of this attempt when the run stopped it before it ended: not recorded,
        the next invocation runs it."""
        stopped = outcome_for_ending(Ending.STOPPED,
                                     "the run was stopped while it ran: the next invocation runs it again")
        return rows.RolloutSummary(
            rollout_id=self.rollout_id, group_id=self.group_id, task_id=self.task.id, attempt=self.attempt,
            status=stopped.status, actor=actor, durable=False, reason=stopped.reason)  # fmt: skip


@dataclass(frozen=True)
class Runner:
    """Who ran a rollout, as its result records it: one per sandbox actor (its pipeline),
    one for the dispatcher (rollouts it ends itself), one per ``farm.Rollouts`` harness."""

    harness: str
    model: str = ""
    mode: RolloutMode = RolloutMode.TOKEN_EXACT  # black_box: a hosted endpoint served the CLI
    actor: str = ""
    node: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", RolloutMode(self.mode))  # its value ("black_box") is the mode too

    @classmethod
    def of(cls, cfg: Any, *, actor: str = "", node: str = "", harness: str | None = None) -> Runner:
        """From a FarmConfig: its harness (unless ``harness``), engine model and mode."""
        return cls(harness=harness or cfg.harness.name, model=cfg.engine.model_name, mode=cfg.mode,
                   actor=actor, node=node)


class RolloutResult(BaseModel):
    """Everything a finished rollout produced. Exactly one status, with its reason.

    Built by ``RolloutResult.of`` (its identity always from its spec) and changed by
    ``ended_as`` (the same rollout, ended otherwise)."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    run_id: str
    rollout_id: str
    group_id: str
    task_id: str
    sample_index: int
    group_index: int | None = None
    attempt: int = 1
    reruns: Reruns = Field(default_factory=Reruns, exclude=True, description="its spec's reruns per kind (not stored)")
    harness: str
    model: str = ""
    status: RolloutStatus
    reason: str = ""
    deterministic: bool = Field(default=False, exclude=True, description="its failure would come back on every "
                                "attempt (farm.errors.FarmError.deterministic): recorded without a rerun; not stored")
    ending: Ending = Field(default=Ending.FINISHED, exclude=True, description="how the attempt ended: in the "
                           "pipeline, or around it as whoever saw it reports it (an actor lost, hung, ...); what the "
                           "reducer's retry decision asks (farm.rollout.retry); not stored")
    reward: float = 0.0
    grading: dict[str, Any] | None = Field(default=None, description="the grading report (JSON-able)")
    grading_summary: dict[str, Any] | None = Field(default=None, description="compact report (Sample metadata)")
    hack_action: HackAction | None = Field(default=None, exclude=True, description="what a hack finding did "
                                           "(grading.on_hack): None when there was none; its grading report keeps it")
    diff: str = ""
    agent_log_tail: str = ""
    counts: rows.RolloutCounts = Field(default_factory=rows.RolloutCounts)
    timings: dict[str, float] = Field(default_factory=dict, description="seconds per phase + total")
    sandbox_id: str = ""
    sandbox_policy: dict[str, str] = Field(
        default_factory=dict, description="the agent sandbox's network and limits policy, as applied"
    )
    actor: str = Field(default="", description="the sandbox actor that ran it")
    mode: RolloutMode = Field(default=RolloutMode.TOKEN_EXACT, description="how its CLI was served: token_exact "
                              "(farm engine: a TurnTree, Samples) or black_box (hosted endpoint: a Transcript)")
    node: str = Field(default="", description="the Ray node id of that actor ('' outside Ray)")
    policy_version_at_finish: int | None = Field(default=None, description="the farm's weight version when recorded")
    started_at: float = 0.0
    finished_at: float = 0.0
    tree: Any = Field(default=None, exclude=True, description="the session's record, as its mode makes it: a TurnTree "
                      "(token_exact) or a Transcript (black_box); not serialized")
    artifacts: Any = Field(
        default=None, exclude=True, description="its RolloutArtifacts (compressed files; the reducer writes them)"
    )

    @classmethod
    def of(cls, spec: RolloutSpec, runner: Runner, outcome: Outcome, *, started_at: float,
           finished_at: float | None = None, **produced: Any) -> RolloutResult:
        """The result of ``spec``'s attempt, run by ``runner``, ended with ``outcome``;
        ``produced``: what the rollout made (reward, grading, diff, counts, tree, ...)."""
        return cls(
            run_id=spec.run_id,
            rollout_id=spec.rollout_id,
            group_id=spec.group_id,
            task_id=spec.task.id,
            sample_index=spec.sample_index,
            group_index=spec.group_index,
            attempt=spec.attempt,
            reruns=spec.reruns,
            harness=runner.harness,
            model=runner.model,
            mode=runner.mode,
            actor=runner.actor,
            node=runner.node,
            status=outcome.status,
            reason=outcome.reason,
            deterministic=outcome.deterministic,
            started_at=started_at,
            finished_at=time.time() if finished_at is None else finished_at,
            **produced,
        )

    def ended_as(self, outcome: Outcome, **changes: Any) -> RolloutResult:
        """The same rollout, ended with ``outcome`` instead (too stale, aborted by its caller)."""
        return self.model_copy(update={"status": outcome.status, "reason": outcome.reason,
                                       "deterministic": outcome.deterministic, **changes})  # fmt: skip

    @property
    def duration_s(self) -> float:
        return max(0.0, self.finished_at - self.started_at)

    def summary(self) -> rows.RolloutSummary:
        return rows.RolloutSummary(
            rollout_id=self.rollout_id,
            group_id=self.group_id,
            task_id=self.task_id,
            attempt=self.attempt,
            status=self.status,
            reason=self.reason,
            reward=self.reward,
            turns=self.counts.turns,
            prompt_tokens=self.counts.prompt_tokens,
            output_tokens=self.counts.output_tokens,
            duration_s=self.duration_s,
            started_at=self.started_at,
            finished_at=self.finished_at,
            sandbox_id=self.sandbox_id,
            actor=self.actor,
            node=self.node,
        )

    def row(self, num_samples: int) -> rows.RolloutRow:
        """Its row of the rollouts table: the fields both declare by the same name, its
        counts, and the JSON columns and status as text."""
        same = {k: getattr(self, k) for k in rows.RolloutRow.model_fields.keys() & type(self).model_fields.keys()
                if k not in (*rows.JSON_COLUMNS, "status")}  # fmt: skip
        return rows.RolloutRow(
            **same, **self.counts.model_dump(), status=self.status.value, num_samples=num_samples,
            duration_s=self.duration_s, grading=self.grading_json(), timings=json.dumps(self.timings, sort_keys=True),
            sandbox_policy=json.dumps(self.sandbox_policy, sort_keys=True),
        )  # fmt: skip

    def grading_json(self) -> str:
        return json.dumps(self.grading, sort_keys=True) if self.grading is not None else ""
