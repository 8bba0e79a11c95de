"""RouterActor as a real Ray actor (simulator mode): serve, manage workers, update weights,
and leave no process behind -- after shutdown and after the actor is killed."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from engine_helpers import farm_engine_pids, live_pids
from farm.actors.router import remote_router_actor
from farm.engine.client import EngineClient, GenerateRequest
from farm.engine.config import EngineConfig, SimulatorConfig

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    """The session's shared local Ray (tests/conftest.py)."""


def engine_cfg(tok_path: str) -> EngineConfig:
    return EngineConfig(mode="simulator", policy="scripted", tokenizer=tok_path, simulator=SimulatorConfig(workers=2))


def wait_gone(pids, timeout: float = 15.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while live_pids(pids) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll: the loop's deadline bounds the wait
    return live_pids(pids)


def test_router_actor_serves_and_shuts_down_cleanly(tok_path):
    actor = remote_router_actor(engine_cfg(tok_path))
    url = ray.get(actor.start.remote(), timeout=120)
    log_dir = ray.get(actor.log_dir.remote())
    pids = ray.get(actor.processes.remote())
    assert set(pids) == {"scripted-0", "scripted-1", "router"}
    assert live_pids(pids.values()) == set(pids.values())
    assert farm_engine_pids(log_dir) == {pids["scripted-0"], pids["scripted-1"]}  # the process table agrees

    async def generate(key: str):
        async with EngineClient(url) as client:
            return await client.generate(GenerateRequest(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 8},
                                                         rid=f"r-{key}-{time.monotonic_ns()}", routing_key=key))

    first = asyncio.run(generate("s1"))
    assert first.output_ids and first.weight_version == "default"
    health = ray.get(actor.health.remote())
    assert health.healthy and len(health.workers) == 2 and health.policy_version == 0

    update = ray.get(actor.update_weights_from_disk.remote("/ckpt/step-1"))
    assert update.policy_version == 1 and len(update.messages) == 2
    assert ray.get(actor.policy_version.remote()) == 1
    assert asyncio.run(generate("s2")).weight_version == "1"

    added = ray.get(actor.add_scripted_worker.remote(), timeout=120)
    assert len(ray.get(actor.workers.remote())) == 3
    pids = ray.get(actor.processes.remote())
    ray.get(actor.remove_worker.remote(added.url))
    assert added.url not in {w.url for w in ray.get(actor.workers.remote())}
    assert not live_pids([pids["scripted-2"]])

    ray.get(actor.shutdown.remote())
    assert not live_pids(pids.values())
    assert farm_engine_pids(log_dir) == set()  # nothing started by this actor is left
    ray.kill(actor)


def test_killed_router_actor_leaves_no_orphans(tok_path):
    actor = remote_router_actor(engine_cfg(tok_path))
    ray.get(actor.start.remote(), timeout=120)
    pids = list(ray.get(actor.processes.remote()).values())
    assert len(live_pids(pids)) == 3
    ray.kill(actor)  # SIGKILL: no shutdown() runs; the parent-death signal must take them down
    assert wait_gone(pids) == set()
