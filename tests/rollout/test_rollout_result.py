"""RolloutResult's one constructor (``RolloutResult.of``) and ``ended_as``: a result's
identity always comes from its spec, whoever builds it (pipeline, dispatcher, handle)."""

from __future__ import annotations

import time

from farm.config import FarmConfig
from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutResult, RolloutSpec, Runner
from farm.rollout.retry import Reruns
from farm.status import Outcome, RolloutStatus
from farm.tasks.model import Task


def _spec() -> RolloutSpec:
    return RolloutSpec(run_id="r", rollout_id="t.3", group_id="t", sample_index=3, task=Task(id="t", instruction="x"),
                       attempt=3, reruns=Reruns(actor_lost=1, infrastructure=1), group_index=7, epoch=1)  # fmt: skip


def test_of_takes_every_identity_field_from_the_spec_and_the_runner():
    spec = _spec()
    runner = Runner(harness="codex", model="m", mode="black_box", actor="sandbox-1", node="n1")
    r = RolloutResult.of(spec, runner, Outcome(status=RolloutStatus.COMPLETED, reason="ok"), started_at=1.0,
                         finished_at=3.5, reward=1.0, diff="d")  # fmt: skip
    shared = set(RolloutResult.model_fields) & set(RolloutSpec.model_fields)
    assert shared == {"run_id", "rollout_id", "group_id", "sample_index", "group_index", "attempt", "reruns"}
    assert all(getattr(r, name) == getattr(spec, name) for name in shared)
    assert r.task_id == "t"
    assert (r.harness, r.model, r.mode, r.actor, r.node) == ("codex", "m", "black_box", "sandbox-1", "n1")
    assert (r.status, r.reason, r.reward, r.diff, r.duration_s) == (RolloutStatus.COMPLETED, "ok", 1.0, "d", 2.5)


def test_of_ends_now_unless_told():
    before = time.time()
    r = RolloutResult.of(_spec(), Runner("claude_code"), Outcome(status=RolloutStatus.SANDBOX_ERROR), started_at=before)
    assert before <= r.finished_at <= time.time()


def test_ended_as_keeps_the_rollout_and_changes_its_end():
    tree = object()
    r = RolloutResult.of(_spec(), Runner("claude_code", model="m"), Outcome(status=RolloutStatus.COMPLETED),
                         started_at=1.0, finished_at=2.0, reward=1.0, tree=tree)  # fmt: skip
    e = r.ended_as(Outcome(status=RolloutStatus.ABORTED, reason="aborted by the caller"), reward=0.0)
    assert (e.status, e.reason, e.reward) == (RolloutStatus.ABORTED, "aborted by the caller", 0.0)
    assert e.tree is tree and e.attempt == 3 and e.group_index == 7 and e.model == "m"
    assert r.status is RolloutStatus.COMPLETED  # the original is unchanged


def test_runner_of_a_config():
    cfg = FarmConfig.model_validate({"harness": {"name": "claude_code"}})
    assert Runner.of(cfg, actor="a") == Runner("claude_code", model=cfg.engine.model_name, mode="token_exact", actor="a")
    assert Runner.of(cfg, harness="codex").harness == "codex"


def test_an_interrupted_summary_is_not_durable():
    s = _spec().interrupted("sandbox-0")
    assert (s.status, s.durable, s.attempt, s.actor) == (RolloutStatus.INTERRUPTED, False, 3, "sandbox-0")
    assert "runs it again" in s.reason
