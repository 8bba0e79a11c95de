"""What a sandbox actor reports itself (farm.actors.metrics): the turns its gateway served,
and its rollouts in flight without a Ray call at every rollout's start and end."""

from __future__ import annotations

import asyncio

from farm.actors import metrics
from farm.actors.sandbox import SandboxActor
from farm.config import FarmConfig
from farm.rollout.model import RolloutSpec
from farm.tasks.model import Task
from farm.trajectory.tree import TurnTree

import farm_helpers


class Recorder:
    calls: list[tuple[str, str, float, dict]] = []

    def __init__(self, spec):
        self.name = spec.name

    def __getattr__(self, how):
        return lambda value, tags: Recorder.calls.append((how, self.name, value, tags))


def test_each_attempt_s_turns_are_observed_by_the_actor_that_served_them(monkeypatch, tmp_path):
    monkeypatch.setattr(metrics, "_make", Recorder)
    monkeypatch.setattr(Recorder, "calls", [])
    tree = TurnTree("g.0")
    tree.append(parent_id=None, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-0.1], finish_reason="stop",
                timings={"engine_ms": 40.0, "parse_ms": 1.0}, flags=["tool_parse_error"])

    class Pipeline:
        async def run(self, spec, observer):
            return farm_helpers.make_result(spec.rollout_id, status="timeout").model_copy(update={"tree": tree})

    cfg = FarmConfig.model_validate({"output": {"dir": str(tmp_path)}})
    actor = SandboxActor(cfg, "http://engine", reducer=None)
    actor._pipeline, actor._slots = Pipeline(), asyncio.Semaphore(1)
    actor._metrics = metrics.ActorMetrics("r1", gauge_refresh_s=None)
    spec = RolloutSpec(run_id="r1", rollout_id="g.0", group_id="g", sample_index=0,
                       task=Task(id="g", instruction="x"))
    asyncio.run(actor.execute(spec))  # an attempt that ends timed out (it may run again): its turns happened
    observed = [(name, value) for how, name, value, _ in Recorder.calls if how == "observe"]
    assert observed == [("farm_engine_latency_s", 0.04), ("farm_gateway_latency_s", 0.001)]
    assert [(name, tags["flag"]) for how, name, _, tags in Recorder.calls if how == "inc"] == [
        ("farm_turn_flags", "tool_parse_error")]


def test_a_gauge_set_often_reaches_ray_at_most_every_interval_and_its_last_value_at_the_refresh(monkeypatch):
    monkeypatch.setattr(metrics, "_make", Recorder)
    monkeypatch.setattr(Recorder, "calls", [])
    now = [100.0]
    monkeypatch.setattr(metrics.time, "monotonic", lambda: now[0])
    m = metrics.ActorMetrics("r1", gauge_refresh_s=3600)  # the refresh thread waits: called by hand below
    try:
        for n in range(1, 51):  # 50 rollouts start within 0.1 s
            m.set_in_flight("sandbox-0", n)
            now[0] += 0.002
        sets = [value for how, _, value, _ in Recorder.calls if how == "set"]
        assert sets == [1]  # the first at once, the rest within the interval: held
        now[0] += metrics.GAUGE_MIN_INTERVAL_S
        m.set_in_flight("sandbox-0", 49)
        assert [value for how, _, value, _ in Recorder.calls if how == "set"] == [1, 49]
        m.set_in_flight("sandbox-0", 48)  # held again
        m.refresh()  # what the refresh thread does every GAUGE_REFRESH_S: the last value reaches Ray
        assert [value for how, _, value, _ in Recorder.calls if how == "set"][-1] == 48
    finally:
        m.close()
