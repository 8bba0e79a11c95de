"""Farm metrics on Ray's metrics pipeline (``ray.util.metrics``).

Each process that reports builds its own ``FarmMetrics`` (Ray aggregates them per
node; the dashboard and Prometheus show them as ``ray_farm_*``). Observations come
from typed records (a finished RolloutResult, its turn timings), so no layer below
``farm.actors`` knows about metrics.
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from farm.rollout.model import RolloutResult

_LATENCY_BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120]
_DURATION_BOUNDS = [1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200]
_REWARD_BOUNDS = [0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]

# What the gateway records in TurnRecord.timings (milliseconds; farm/gateway/service.py):
# the engine's /generate time, and the gateway's own steps around it.
ENGINE_TIMING_KEY = "engine_ms"
GATEWAY_TIMING_KEYS = ("plan_ms", "render_ms", "parse_ms", "record_ms")


def turn_latencies(timings: dict[str, float]) -> tuple[float | None, float | None]:
    """(engine seconds, gateway seconds) of one turn, None where not recorded."""
    engine = timings.get(ENGINE_TIMING_KEY)
    parts = [timings[k] for k in GATEWAY_TIMING_KEYS if isinstance(timings.get(k), (int, float))]
    return (
        float(engine) / 1e3 if isinstance(engine, (int, float)) else None,
        sum(parts) / 1e3 if parts else None,
    )


class FarmMetrics:
    """The farm's series. Cheap to build; build one per process."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        tags = ("run_id",)
        self.rollouts = Counter("farm_rollouts", "finished rollouts by status", tag_keys=tags + ("status", "harness"))
        self.in_flight = Gauge("farm_rollouts_in_flight", "rollouts running now", tag_keys=tags + ("actor",))
        self.turns = Counter("farm_turns", "model calls recorded", tag_keys=tags + ("harness",))
        self.tokens = Counter("farm_tokens", "tokens by kind (prompt, output)", tag_keys=tags + ("kind",))
        self.reward = Histogram("farm_reward", "rollout reward", boundaries=_REWARD_BOUNDS, tag_keys=tags)
        self.duration = Histogram(
            "farm_rollout_duration_s", "rollout wall time", boundaries=_DURATION_BOUNDS, tag_keys=tags + ("status",)
        )
        self.engine_latency = Histogram(
            "farm_engine_latency_s", "engine /generate time per turn", boundaries=_LATENCY_BOUNDS, tag_keys=tags
        )
        self.gateway_latency = Histogram(
            "farm_gateway_latency_s", "gateway time per turn", boundaries=_LATENCY_BOUNDS, tag_keys=tags
        )
        self.sandbox_create = Histogram(
            "farm_sandbox_create_s", "sandbox create latency", boundaries=_LATENCY_BOUNDS, tag_keys=tags
        )
        self.shards = Counter("farm_shards_written", "shards made durable by the reducer", tag_keys=tags + ("table",))
        # Exact sums (histogram sums are bucket-free in Prometheus but not per class): mean reward
        # = farm_reward_sum / farm_rollouts over the same labels.
        self.by_class = Counter("farm_rollouts_by_class", "finished rollouts: policy / infrastructure",
                                tag_keys=tags + ("class",))  # fmt: skip
        self.reward_sum = Counter("farm_reward_sum", "sum of rewards of policy outcomes", tag_keys=tags)
        self.duration_sum = Counter("farm_rollout_seconds_sum", "sum of rollout wall times", tag_keys=tags + ("status",))
        self.attempts = Counter("farm_rollout_retries", "recorded rollouts' attempts beyond the first",
                                tag_keys=tags + ("class",))  # fmt: skip

    def _t(self, **extra: str) -> dict[str, str]:
        return {"run_id": self.run_id, **extra}

    def set_in_flight(self, actor: str, n: int) -> None:
        self.in_flight.set(n, tags=self._t(actor=actor))

    def observe_sandbox_create(self, seconds: float) -> None:
        self.sandbox_create.observe(seconds, tags=self._t())

    def observe_shard(self, table: str, n: int = 1) -> None:
        if n:
            self.shards.inc(n, tags=self._t(table=table))

    def observe_rollout(self, result: RolloutResult) -> None:
        status = result.status.value
        self.rollouts.inc(1, tags=self._t(status=status, harness=result.harness))
        self.duration.observe(result.duration_s, tags=self._t(status=status))
        if result.duration_s > 0:  # Ray counters take positive increments only
            self.duration_sum.inc(result.duration_s, tags=self._t(status=status))
        cls = result.status.failure_class.value
        self.by_class.inc(1, tags=self._t(**{"class": cls}))
        if result.attempt > 1:
            self.attempts.inc(result.attempt - 1, tags=self._t(**{"class": cls}))
        self.reward.observe(result.reward, tags=self._t())
        if result.status.trainable and result.reward > 0:
            self.reward_sum.inc(result.reward, tags=self._t())
        counts = result.counts
        if counts.turns:
            self.turns.inc(counts.turns, tags=self._t(harness=result.harness))
        if counts.prompt_tokens:
            self.tokens.inc(counts.prompt_tokens, tags=self._t(kind="prompt"))
        if counts.output_tokens:
            self.tokens.inc(counts.output_tokens, tags=self._t(kind="output"))
        tree = result.tree
        for turn in getattr(tree, "turns", ()) or ():
            engine, gateway = turn_latencies(getattr(turn, "timings", None) or {})
            if engine is not None:
                self.engine_latency.observe(engine, tags=self._t())
            if gateway is not None:
                self.gateway_latency.observe(gateway, tags=self._t())
