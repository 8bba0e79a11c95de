"""The dispatcher's guard ends one hung rollout of a batch on its own (real Ray, the real
Dispatcher and SandboxActor.run_many; the rollouts themselves are stand-ins)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import ray
from ray import cloudpickle

from farm.actors.dispatch import Dispatcher
from farm.actors.reducer import ReducerActor
from farm.actors.sandbox import SandboxActor
from farm.config import FarmConfig
from farm.output.rows import RolloutSummary
from farm.rollout.model import RolloutSpec
from farm.rollout.retry import RetryBudgets
from farm.run.summary import SummaryTally
from farm.status import RolloutStatus
from farm.tasks.model import Task


class _Actor(SandboxActor):
    """Its rollouts end at once, completed; ``t1``'s first attempt hangs until aborted."""

    def __init__(self) -> None:
        super().__init__(FarmConfig(), "http://engine", reducer=None)
        self.aborted: list[str] = []

    async def run(self, spec: RolloutSpec):  # type: ignore[override]
        if spec.task.id == "t1" and spec.attempt == 1:
            try:
                await asyncio.sleep(3600)  # a hung attempt: only a cancel ends it
            except asyncio.CancelledError:
                self.aborted.append(spec.rollout_id)
                raise
        await asyncio.sleep(0.01)  # an attempt takes a moment
        done = spec.interrupted("a0")
        return done.model_copy(update={"status": RolloutStatus.COMPLETED, "durable": True, "reason": ""})

    async def seen_aborts(self) -> list[str]:
        return self.aborted


class _Reducer:
    """Decides each attempt's end as the run's reducer does (its one retry decision), records nothing."""

    _stale = ReducerActor._stale
    _decide = ReducerActor._decide

    def __init__(self, cfg: FarmConfig) -> None:
        self.cfg, self.budgets = cfg, RetryBudgets.from_config(cfg)
        self.policy_version, self.stale_dropped, self._stopping = 0, 0, False

    async def submit(self, result):
        ended = self._decide(result)
        return ended if isinstance(ended, RolloutSummary) else ended.summary()

    async def lookup(self, rollout_id):
        return None


class _Progress:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message):
        self.notes.append(message)

    def grow(self, n):
        pass

    def advance(self, summary, in_flight):
        pass


@pytest.fixture(scope="module")
def local_ray(shared_ray):
    """The session's shared local Ray (tests/conftest.py)."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import a test module


@pytest.mark.slow  # a local Ray: ~5 s
def test_a_hung_rollout_is_ended_alone_and_runs_again(local_ray):
    cfg = FarmConfig.model_validate({"rollout": {"concurrency": 8, "infra_retries": 1, "retry_backoff_s": 0}})
    actor = ray.remote(_Actor).remote()
    reducer = ray.remote(_Reducer).remote(cfg)
    try:
        # up before the clock starts: on a loaded machine the actor's worker takes seconds to
        # start, and the guard times a rollout from its dispatch, not the actor's start-up
        assert ray.get(actor.seen_aborts.remote(), timeout=120) == []
        specs = [RolloutSpec(run_id="r", rollout_id=f"t{i}.0", group_id=f"t{i}", sample_index=0,
                             task=Task(id=f"t{i}", instruction="x")) for i in range(4)]  # fmt: skip
        progress = _Progress()
        d = Dispatcher(cfg, {"a0": actor}, reducer=reducer, progress=progress, tally=SummaryTally(), guard_s=2.0)
        tally = d.run(specs)
        assert tally.count == 4 and d.retried == 1  # every rollout once; the hung one ran again
        assert tally.by_status == {"completed": 4}
        assert any("t1.0: rollout exceeded" in n and "retrying" in n for n in progress.notes), progress.notes
        assert ray.get(actor.seen_aborts.remote()) == ["t1.0"]  # told to stop it (the others went on)
        assert not d.inflight and d.inflight.batches == []
    finally:  # the Ray is shared with the next modules (tests/conftest.py), failed or not
        for a in (actor, reducer):
            ray.kill(a)
