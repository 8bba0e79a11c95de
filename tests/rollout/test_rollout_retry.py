"""The one retry decision (farm.rollout.retry.decide): every status x how it ended x
budget state, without Ray. Each kind of rerun spends only its own budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from farm.config import FarmConfig
from farm.rollout.model import RolloutSpec
from farm.rollout.outcome import Ending
from farm.rollout.retry import RetryBudgets, RetryKind, Reruns, Verdict, decide
from farm.status import RolloutStatus as S
from farm.tasks.model import Task

V, K = Verdict, RetryKind
BUDGETS = RetryBudgets(infrastructure=2, actor_lost=1, stale=3, backoff_s=0.5)  # distinct: a swapped budget shows

# How an attempt that FINISHED with each status is treated while every budget has room.
FINISHED = {
    S.COMPLETED: (V.RECORD, None),
    S.TIMEOUT: (V.RECORD, None),
    S.TRUNCATED: (V.RECORD, None),  # the policy's own budget ran out: a rerun would run it out again
    S.LIMIT_EXCEEDED: (V.RECORD, None),
    S.PATCH_FAILED: (V.RECORD, None),
    S.AGENT_ERROR: (V.RUN_AGAIN, K.INFRASTRUCTURE),
    S.SETUP_FAILED: (V.RUN_AGAIN, K.INFRASTRUCTURE),
    S.SANDBOX_ERROR: (V.RUN_AGAIN, K.INFRASTRUCTURE),
    S.ENGINE_ERROR: (V.RUN_AGAIN, K.INFRASTRUCTURE),
    S.GRADING_ERROR: (V.RUN_AGAIN, K.INFRASTRUCTURE),
    S.AUTH_ERROR: (V.RECORD, None),  # a refused key stays refused
    S.ABORTED: (V.RECORD, None),  # a caller's decision
    S.INTERRUPTED: (V.DROP, None),
    S.CANCELLED: (V.DROP, None),
    S.STALE: (V.RUN_AGAIN, K.STALE),
}
# The other endings: the kind they spend, and what the rollout is recorded as once it is spent.
OTHER_ENDINGS = {
    Ending.ACTOR_LOST: (K.ACTOR_LOST, S.SANDBOX_ERROR),
    Ending.TOO_STALE: (K.STALE, S.STALE),
    Ending.HUNG: (K.INFRASTRUCTURE, S.SANDBOX_ERROR),  # the lead's call: a hung actor spends the infra budget
}
GRADED = {S.COMPLETED, S.TRUNCATED}  # finished to its end: kept even while the run stops


def test_the_table_names_every_status():
    assert set(FINISHED) == set(S)


def _reruns(own: K | None, state: str) -> Reruns:
    """``fresh``: nothing spent; ``own_spent``: ``own``'s budget used up; ``others_spent``: every
    other kind's budget used up (``own`` untouched)."""
    if state == "fresh" or own is None and state == "own_spent":
        return Reruns()
    kinds = [own] if state == "own_spent" else [k for k in K if k is not own]
    return Reruns(**{k.value: BUDGETS.of(k) for k in kinds})


@pytest.mark.parametrize("stopping", [False, True], ids=["running", "stopping"])
@pytest.mark.parametrize("state", ["fresh", "own_spent", "others_spent"])
@pytest.mark.parametrize("ending", [Ending.FINISHED, *OTHER_ENDINGS], ids=lambda e: e.value)
@pytest.mark.parametrize("status", list(S), ids=lambda s: s.value)
def test_decide_every_status_ending_and_budget(status, ending, state, stopping):
    if ending is Ending.FINISHED:
        verdict, kind = FINISHED[status]
        recorded_as = S.STALE if status is S.STALE else None  # else recorded as it ended
    else:
        kind, recorded_as = OTHER_ENDINGS[ending]
        verdict = V.RUN_AGAIN
        if status in (S.INTERRUPTED, S.CANCELLED):
            verdict, kind = V.DROP, None
    if stopping and status not in GRADED:
        verdict, kind = V.DROP, None
    reruns = _reruns(kind, state)
    if verdict is V.RUN_AGAIN and state == "own_spent":
        verdict = V.RECORD  # out of its own budget: recorded (under recorded_as when the ending says so)
    d = decide(status, reruns, BUDGETS, ending=ending, stopping=stopping)
    assert d.verdict is verdict, d
    if verdict is V.DROP:
        assert d.status is S.INTERRUPTED
    elif verdict is V.RUN_AGAIN:
        assert d.kind is kind and d.status is None
    elif kind is not None:  # recorded because its budget ran out
        assert d.kind is kind and d.status is recorded_as and d.reason
    else:
        assert d.status is None  # recorded as it ended


def test_infrastructure_backoff_doubles_per_infrastructure_rerun_only():
    delays = [decide(S.ENGINE_ERROR, Reruns(infrastructure=n), BUDGETS).delay_s for n in range(2)]
    assert delays == [0.5, 1.0]
    assert decide(S.ENGINE_ERROR, Reruns(actor_lost=1, stale=3), BUDGETS).delay_s == 0.5
    assert decide(S.ENGINE_ERROR, Reruns(), BUDGETS, ending=Ending.ACTOR_LOST).delay_s == 0.0


def test_actor_death_reason_counts_the_deaths():
    d = decide(S.SANDBOX_ERROR, Reruns(actor_lost=1), BUDGETS, ending=Ending.ACTOR_LOST)
    assert d.verdict is V.RECORD and "died 2 time(s)" in d.reason


def test_budgets_come_from_the_unchanged_config_keys():
    cfg = FarmConfig.model_validate({
        "harness": {"name": "claude_code"},
        "rollout": {"max_attempts": 4, "infra_retries": 1, "retry_backoff_s": 3.0},
        "stream": {"max_stale_reruns": 5},
    })
    assert RetryBudgets.from_config(cfg) == RetryBudgets(infrastructure=1, actor_lost=3, stale=5, backoff_s=3.0)


_ENDINGS = st.sampled_from([(S.ENGINE_ERROR, Ending.FINISHED), (S.SANDBOX_ERROR, Ending.ACTOR_LOST),
                            (S.COMPLETED, Ending.TOO_STALE), (S.SANDBOX_ERROR, Ending.HUNG)])


@settings(max_examples=200, deadline=None)
@given(st.lists(_ENDINGS, min_size=1, max_size=20))
def test_each_kind_spends_only_its_own_budget(endings):
    """Whatever order failures come in, a rollout runs again exactly while the budget of
    the kind that just failed has room, and no budget goes over."""
    reruns = Reruns()
    for status, ending in endings:
        d = decide(status, reruns, BUDGETS, ending=ending)
        assert d.verdict in (V.RUN_AGAIN, V.RECORD)
        assert (d.verdict is V.RUN_AGAIN) == (reruns.spent(d.kind) < BUDGETS.of(d.kind))
        if d.verdict is V.RECORD:
            break
        reruns = reruns.after(d.kind)
    assert all(reruns.spent(k) <= BUDGETS.of(k) for k in K)


def _spec() -> RolloutSpec:
    return RolloutSpec(run_id="r", rollout_id="a.0", group_id="a", sample_index=0, task=Task(id="a", instruction="x"))


def _dispatches(endings: list[tuple[S, Ending]], budgets: RetryBudgets) -> RolloutSpec:
    """Run a spec through ``endings`` as the dispatcher would; the attempt that was recorded."""
    spec = _spec()
    for status, ending in endings:
        d = decide(status, spec.reruns, budgets, ending=ending)
        if not d.runs_again:
            return spec
        spec = spec.next(d.kind)
    raise AssertionError("still running again")


def test_redispatch_after_actor_deaths_is_bounded_by_max_attempts():
    spec = _dispatches([(S.SANDBOX_ERROR, Ending.ACTOR_LOST)] * 9, RetryBudgets(infrastructure=2, actor_lost=2, stale=3, backoff_s=2.0))  # max_attempts 3
    assert spec.attempt == 3 and spec.reruns == Reruns(actor_lost=2) and spec.rollout_id == "a.0"


def test_an_actor_death_leaves_every_infrastructure_retry():
    """One actor death, then an infrastructure failure every time: recorded at attempt
    4 = 1 + 1 death + 2 infrastructure retries (each kind spends its own budget: a death
    counted against the infrastructure budget would record it at 3)."""
    endings = [(S.SANDBOX_ERROR, Ending.ACTOR_LOST)] + [(S.ENGINE_ERROR, Ending.FINISHED)] * 9
    spec = _dispatches(endings, RetryBudgets(infrastructure=2, actor_lost=2, stale=3, backoff_s=2.0))
    assert spec.attempt == 4 and spec.reruns == Reruns(infrastructure=2, actor_lost=1)


@pytest.mark.parametrize("status", list(S), ids=lambda s: s.value)
def test_a_deterministic_failure_is_recorded_at_once(status):
    """A failure every attempt would meet again (a missing repository, a setup command's own
    error) is recorded on its first attempt, with its budget untouched; a policy outcome stays
    one, and a run that is stopping still drops what it stopped."""
    d = decide(status, Reruns(), BUDGETS, deterministic=True)
    if status in (S.INTERRUPTED, S.CANCELLED):
        assert d.verdict is V.DROP
    elif status is S.STALE:
        assert d.verdict is V.RUN_AGAIN  # stale is about weights, not the task: run again under the new ones
    else:
        assert d.verdict is V.RECORD and d.kind is None, d
    assert decide(status, Reruns(), BUDGETS, deterministic=True, stopping=True).verdict is (
        V.RECORD if status in GRADED else V.DROP)
    if FINISHED[status] == (V.RUN_AGAIN, K.INFRASTRUCTURE):
        assert "not retried" in d.reason and decide(status, Reruns(), BUDGETS).runs_again


@pytest.mark.parametrize("ending", [Ending.ACTOR_FAILED, Ending.GIVEN_UP], ids=lambda e: e.value)
def test_a_bug_around_the_pipeline_and_a_rollout_given_up_are_recorded_at_once(ending):
    """A bug in the actor running the pipeline meets the same code on a rerun; a rollout the
    run gave up on has no actor left to run it: both recorded, no budget spent (dropped only
    when the run is stopping, as anything unfinished is)."""
    d = decide(S.SANDBOX_ERROR, Reruns(), BUDGETS, ending=ending)
    assert (d.verdict, d.kind, d.status) == (V.RECORD, None, None)
    assert decide(S.SANDBOX_ERROR, Reruns(), BUDGETS, ending=ending, stopping=True).verdict is V.DROP
