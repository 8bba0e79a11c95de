"""Latency and fault injection for the scripted worker: small pure decisions.

The server draws one :class:`RequestPlan` per request from its seeded RNG (in arrival
order, so a sequential workload is reproducible per seed) and carries it out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from farm.engine.config import FaultConfig, LatencyConfig
from farm.simulator.generation import jittered


class Fault(str, Enum):
    NONE = "none"
    ERROR = "error"  # HTTP 500 before generating
    HANG = "hang"  # no answer until hang_s passes or the client goes away
    DROP = "drop"  # the connection is closed mid-response
    MALFORMED = "malformed"  # HTTP 200 with a body that is not a /generate reply


@dataclass(frozen=True, slots=True)
class RequestPlan:
    fault: Fault
    ttft_s: float
    per_token_s: float
    drop_after_fraction: float  # DROP: share of the output sent before the cut


def decide_fault(rng: random.Random, cfg: FaultConfig) -> Fault:
    """One draw against the cumulative rates (error, hang, drop, then malformed)."""
    x = rng.random()
    for fault, rate in ((Fault.ERROR, cfg.error_rate), (Fault.HANG, cfg.hang_rate), (Fault.DROP, cfg.drop_rate),
                        (Fault.MALFORMED, cfg.malformed_rate)):  # fmt: skip
        if x < rate:
            return fault
        x -= rate
    return Fault.NONE


def plan_request(rng: random.Random, latency: LatencyConfig, faults: FaultConfig) -> RequestPlan:
    fault = decide_fault(rng, faults)
    per_token = 1.0 / latency.tokens_per_s if latency.tokens_per_s > 0 else 0.0
    return RequestPlan(
        fault=fault,
        ttft_s=jittered(latency.ttft_s, latency.jitter, rng),
        per_token_s=jittered(per_token, latency.jitter, rng),
        drop_after_fraction=rng.uniform(0.2, 0.8),
    )
