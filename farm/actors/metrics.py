"""Farm metrics on Ray's metrics pipeline (``ray.util.metrics``).

``METRICS`` is the one place each series is declared (name, kind, help, labels, buckets):
``ActorMetrics`` builds Ray's metric objects from it, and the Grafana dashboard
(``farm.actors.dashboard``) and the docs' metric list are derived from it, so none of
them can name a series farm does not export.

Each actor that reports builds its own ``ActorMetrics`` (Ray exports them at each node's
metrics port as ``ray_farm_*``). Observations come from typed records (a finished
RolloutResult, its turn timings), so no layer below ``farm.actors`` knows about metrics.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from farm.rollout.model import RolloutResult

RESOLVED_REWARD = 1.0  # as farm.run.summary counts "resolved"
_LATENCY_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_DURATION_BOUNDS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
_REWARD_BOUNDS = (0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
_STALENESS_BOUNDS = (0.5, 1, 2, 4, 8, 16)  # weight versions (0 lands in the first bucket)
# Ray's metrics agent drops a gauge that was not set within two export intervals (each
# >= 1 s; ray._private.telemetry), even while its process lives: an idle actor's "in flight"
# or a weight version set once would vanish from Prometheus. So gauges are set again this often.
GAUGE_REFRESH_S = 1.0
# A gauge set more often than this (a sandbox actor's "in flight" moves at every rollout's
# start and end: hundreds of times a second at size) reaches Ray at most this often; the
# refresh above sets its last value. Ray exports every few seconds: nothing is seen later.
GAUGE_MIN_INTERVAL_S = 0.25

# What the gateway records in TurnRecord.timings (milliseconds; farm/gateway/service.py):
# the engine's /generate time, and the gateway's own steps around it.
ENGINE_TIMING_KEY = "engine_ms"
GATEWAY_TIMING_KEYS = ("plan_ms", "render_ms", "parse_ms", "record_ms")


@dataclass(frozen=True)
class MetricSpec:
    """One exported series. Every series also carries ``run_id``."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    unit: str = ""  # Grafana's unit id of the value (s, short, percentunit, ...)

    @property
    def tag_keys(self) -> tuple[str, ...]:
        return ("run_id", *self.labels)

    @property
    def series(self) -> str:
        """The name Prometheus stores: Ray prefixes ``ray_``; counters end in ``_total``."""
        return f"ray_{self.name}" + ("_total" if self.kind == "counter" else "")


ROLLOUTS = MetricSpec("farm_rollouts", "counter", "finished rollouts by status", ("status", "harness"))
BY_CLASS = MetricSpec("farm_rollouts_by_class", "counter", "finished rollouts: policy / infrastructure", ("class",))
RESOLVED = MetricSpec("farm_resolved", "counter", f"policy outcomes with reward >= {RESOLVED_REWARD:g} (resolved)")
IN_FLIGHT = MetricSpec("farm_rollouts_in_flight", "gauge", "rollouts running now, per sandbox actor", ("actor",))
RETRIES = MetricSpec("farm_rollout_retries", "counter", "recorded rollouts' attempts beyond the first", ("class",))
REWARD = MetricSpec("farm_reward", "histogram", "rollout reward", buckets=_REWARD_BOUNDS)
REWARD_SUM = MetricSpec("farm_reward_sum", "counter", "sum of rewards of policy outcomes (mean = it / policy rollouts)")
DURATION = MetricSpec("farm_rollout_duration_s", "histogram", "rollout wall time", ("status",), _DURATION_BOUNDS, "s")
DURATION_SUM = MetricSpec("farm_rollout_seconds_sum", "counter", "sum of rollout wall times", ("status",), unit="s")
TURNS = MetricSpec("farm_turns", "counter", "model calls recorded", ("harness",))
TOKENS = MetricSpec("farm_tokens", "counter", "tokens by kind (prompt, output)", ("kind",))
ENGINE_ERRORS = MetricSpec("farm_engine_errors", "counter", "turns the engine failed (finish reason error)")
TURN_FLAGS = MetricSpec("farm_turn_flags", "counter",
                        "turns the gateway flagged: tool-call parse errors, full renders, drift, budget stops",
                        ("flag",))  # fmt: skip
ENGINE_LATENCY = MetricSpec("farm_engine_latency_s", "histogram", "engine /generate time per turn", (),
                            _LATENCY_BOUNDS, "s")  # fmt: skip
GATEWAY_LATENCY = MetricSpec("farm_gateway_latency_s", "histogram", "gateway time per turn (plan, render, parse, record)",
                             (), _LATENCY_BOUNDS, "s")  # fmt: skip
SANDBOX_CREATE = MetricSpec("farm_sandbox_create_s", "histogram", "sandbox create latency", (), _LATENCY_BOUNDS, "s")
SHARDS = MetricSpec("farm_shards_written", "counter", "shards made durable by the reducer", ("table",))
POLICY_VERSION = MetricSpec("farm_policy_version", "gauge", "the farm's current weight version (reducer)")
STALENESS = MetricSpec("farm_rollout_staleness", "histogram",
                       "weight versions between a recorded rollout's oldest trained turn and the farm's weights",
                       buckets=_STALENESS_BOUNDS)  # fmt: skip

METRICS: tuple[MetricSpec, ...] = (
    ROLLOUTS, BY_CLASS, RESOLVED, IN_FLIGHT, RETRIES, REWARD, REWARD_SUM, DURATION, DURATION_SUM, TURNS, TOKENS,
    ENGINE_ERRORS, TURN_FLAGS, ENGINE_LATENCY, GATEWAY_LATENCY, SANDBOX_CREATE, SHARDS, POLICY_VERSION, STALENESS,
)  # fmt: skip


def turn_latencies(timings: dict[str, float]) -> tuple[float | None, float | None]:
    """(engine seconds, gateway seconds) of one turn, None where not recorded."""
    engine = timings.get(ENGINE_TIMING_KEY)
    parts = [timings[k] for k in GATEWAY_TIMING_KEYS if isinstance(timings.get(k), (int, float))]
    return (
        float(engine) / 1e3 if isinstance(engine, (int, float)) else None,
        sum(parts) / 1e3 if parts else None,
    )


def _make(spec: MetricSpec) -> Any:
    # heavy: ray
    from ray.util.metrics import Counter, Gauge, Histogram

    if spec.kind == "histogram":
        return Histogram(spec.name, spec.help, boundaries=list(spec.buckets), tag_keys=spec.tag_keys)
    return (Counter if spec.kind == "counter" else Gauge)(spec.name, spec.help, tag_keys=spec.tag_keys)


class ActorMetrics:
    """The farm's series as one actor reports them. Cheap to build; build one per process
    (``close()`` it when done).

    ``sum_counters``: counter increments are summed here, per series and tags, and reach
    Ray only at ``flush_counters()`` (one ``inc`` per series and tags): for the reducer,
    which would otherwise make ~15 Ray calls per rollout, and flushes after each commit. The
    exported totals are the same; they move at each flush rather than each rollout."""

    def __init__(self, run_id: str, *, gauge_refresh_s: float | None = GAUGE_REFRESH_S,
                 sum_counters: bool = False) -> None:  # fmt: skip
        self.run_id = run_id
        self._m = {spec.name: _make(spec) for spec in METRICS}
        # counter increments not yet given to Ray (sum_counters), by (series, sorted tags)
        self._counter_sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] | None = {} if sum_counters else None
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # last value per series
        self._gauge_set_at: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}  # when Ray was last given it
        self._throttle_gauges = bool(gauge_refresh_s)  # only with a refresh to set the last value
        self._lock = threading.Lock()
        self._closed = threading.Event()
        if gauge_refresh_s:
            threading.Thread(target=self._refresh_loop, args=(gauge_refresh_s,), name="farm-metrics-gauges",
                             daemon=True).start()  # fmt: skip

    def _inc(self, spec: MetricSpec, value: float = 1, **tags: str) -> None:
        if value <= 0:  # Ray counters take positive increments only
            return
        if self._counter_sums is None:
            self._m[spec.name].inc(value, tags={"run_id": self.run_id, **tags})
            return
        key = (spec.name, tuple(sorted(tags.items())))
        self._counter_sums[key] = self._counter_sums.get(key, 0) + value

    def flush_counters(self) -> None:
        """Give Ray the counter increments summed since the last flush (``sum_counters``)."""
        if not self._counter_sums:
            return
        sums, self._counter_sums = self._counter_sums, {}
        for (name, tags), value in sums.items():
            self._m[name].inc(value, tags={"run_id": self.run_id, **dict(tags)})

    def _set(self, spec: MetricSpec, value: float, **tags: str) -> None:
        tags = {"run_id": self.run_id, **tags}
        key = (spec.name, tuple(sorted(tags.items())))
        now = time.monotonic()
        with self._lock:
            self._gauges[key] = value
            last = self._gauge_set_at.get(key)
            if self._throttle_gauges and last is not None and now - last < GAUGE_MIN_INTERVAL_S:
                return  # the refresh sets it (GAUGE_MIN_INTERVAL_S)
            self._gauge_set_at[key] = now
        self._m[spec.name].set(value, tags=tags)

    def _observe(self, spec: MetricSpec, value: float, **tags: str) -> None:
        self._m[spec.name].observe(value, tags={"run_id": self.run_id, **tags})

    def refresh(self) -> None:
        """Set every gauge again to its last value (see GAUGE_REFRESH_S)."""
        with self._lock:
            last = list(self._gauges.items())
        for (name, tags), value in last:
            self._m[name].set(value, tags=dict(tags))

    def _refresh_loop(self, every: float) -> None:
        while not self._closed.wait(every):
            self.refresh()

    def close(self) -> None:
        self._closed.set()

    def set_in_flight(self, actor: str, n: int) -> None:
        self._set(IN_FLIGHT, n, actor=actor)

    def set_policy_version(self, version: int) -> None:
        self._set(POLICY_VERSION, version)

    def observe_sandbox_create(self, seconds: float) -> None:
        self._observe(SANDBOX_CREATE, seconds)

    def observe_shard(self, table: str, n: int = 1) -> None:
        self._inc(SHARDS, n, table=table)

    def observe_rollout(self, result: RolloutResult) -> None:
        status = result.status.value
        cls = result.status.failure_class.value
        self._inc(ROLLOUTS, status=status, harness=result.harness)
        self._inc(BY_CLASS, **{"class": cls})
        self._observe(DURATION, result.duration_s, status=status)
        self._inc(DURATION_SUM, result.duration_s, status=status)
        self._inc(RETRIES, result.attempt - 1, **{"class": cls})
        self._observe(REWARD, result.reward)
        if result.status.trainable:
            self._inc(REWARD_SUM, result.reward)
            self._inc(RESOLVED, 1 if result.reward >= RESOLVED_REWARD else 0)
        counts = result.counts
        self._inc(TURNS, counts.turns, harness=result.harness)
        self._inc(TOKENS, counts.prompt_tokens, kind="prompt")
        self._inc(TOKENS, counts.output_tokens, kind="output")
        self._inc(ENGINE_ERRORS, counts.engine_errors)
        if counts.policy_version_min is not None and result.policy_version_at_finish is not None:
            self._observe(STALENESS, max(0, result.policy_version_at_finish - counts.policy_version_min))

    def observe_turns(self, tree: Any) -> None:
        """Each turn of a finished attempt's session: its engine and gateway latency, its
        flags. Observed by the sandbox actor whose gateway served the turns, for every
        attempt (one that runs again served its turns too): per turn, so not in the one
        reducer, whose work per rollout must not grow with the turns."""
        for turn in getattr(tree, "turns", ()) or ():
            engine, gateway = turn_latencies(getattr(turn, "timings", None) or {})
            if engine is not None:
                self._observe(ENGINE_LATENCY, engine)
            if gateway is not None:
                self._observe(GATEWAY_LATENCY, gateway)
            for flag in getattr(turn, "flags", ()) or ():
                self._inc(TURN_FLAGS, flag=getattr(flag, "value", str(flag)))
