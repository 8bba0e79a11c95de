"""The farm on a real multi-node Ray cluster (tests/farm/farm_multinode.py): the driver's
code path of `farm run` (``run_batch``), the real Claude Code CLI, the scripted engine,
local sandboxes under a per-node root. Sandbox actors go to the ``sandbox_node`` nodes,
the router to the ``engine_node`` (the head); a worker node killed mid-run (raylet and
workers, no grace) loses nothing, and when it comes back it gets work and its sandboxes
are reaped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from farm.config import FarmConfig
from farm.run.batch import run_batch
from farm.output.writer import ROLLOUTS_TABLE, SAMPLES_TABLE
from farm.output.shard_reader import ShardReader

from farm_multinode import MultiNode

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]


@pytest.fixture(scope="module")
def cluster():
    c = MultiNode(2, head_resources={})  # head: the driver and the reducer; w0, w1: sandbox_node
    c.add("gpu", {"engine_node": 1})  # the router and its (scripted) engine
    c.connect()
    yield c
    c.shutdown()


def _cfg(tmp_path: Path, run_id: str, *, limit: int, ttft_s: float = 0.0) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": run_id,
        "tasks": {"path": "demo"},
        "harness": {"name": "claude_code"},
        "engine": {"mode": "simulator", "policy": "oracle", "simulator": {"workers": 1, "latency": {"ttft_s": ttft_s}}},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb" / "$FARM_NODE_NAME")}},
        "rollout": {"n_samples": 2, "limit": limit, "concurrency": 2, "timeout_s": 300},
        "placement": {"sandbox_resource": "sandbox_node", "engine_resource": "engine_node", "watch_nodes_s": 1},
        "ray": {"reducer_flush_s": 0.2},
        "output": {"dir": str(tmp_path / "out")},
    })


def _tables(out: Path) -> tuple[list[dict], list[str]]:
    rows = ShardReader(out, name=ROLLOUTS_TABLE).read_table().to_pylist()
    samples = ShardReader(out, name=SAMPLES_TABLE).read_table().column("rollout_id").to_pylist()
    return rows, samples


def _assert_once(rows: list[dict], samples: list[str], n: int) -> None:
    ids = [r["rollout_id"] for r in rows]
    assert len(ids) == len(set(ids)) == n, ids  # every rollout recorded exactly once
    assert all(r["status"] == "completed" for r in rows), [(r["rollout_id"], r["status"], r["reason"]) for r in rows]
    assert set(samples) == set(ids) and len(samples) == sum(r["num_samples"] for r in rows)  # no Sample doubled


def _left(root: Path) -> list[str]:
    return [str(p) for p in root.glob("*/*/*")] if root.exists() else []


def test_rollouts_spread_over_sandbox_nodes(cluster, tmp_path):
    summary = run_batch(_cfg(tmp_path, "spread", limit=4), console=Console(quiet=True))
    rows, samples = _tables(tmp_path / "out")
    _assert_once(rows, samples, 4)
    workers = {cluster.node_id("w0"), cluster.node_id("w1")}
    assert {r["node"] for r in rows} == workers  # both sandbox nodes ran rollouts, the head none
    assert summary.nodes == {n: 2 for n in workers} and not summary.lost_nodes
    placed = cluster.placed("farm-spread-")
    assert placed.pop("farm-spread-reducer") == cluster.head_id  # where the output directory is
    assert placed.pop("farm-spread-router") == cluster.node_id("gpu")
    assert sorted(placed.values()) == sorted(workers)  # one sandbox actor per sandbox node
    # each node created its sandboxes under its own root, and closed them
    assert {p.name for p in (tmp_path / "sb").iterdir()} == {"w0", "w1"}  # none on the head or the gpu node
    assert not _left(tmp_path / "sb")


def test_node_killed_mid_run_loses_nothing_and_its_return_gets_work(cluster, tmp_path):
    cfg = _cfg(tmp_path, "nodeloss", limit=8, ttft_s=0.5)
    dead_id = cluster.node_id("w0")
    events: dict[str, float] = {}

    def chaos():
        deadline = time.monotonic() + 240
        while not _left(tmp_path / "sb" / "w0") and time.monotonic() < deadline:  # a rollout in flight on w0
            time.sleep(0.1)
        time.sleep(2.0)  # the rollout runs a while on w0 before the node dies
        events["killed"] = time.time()
        cluster.kill("w0", wait_dead_s=30)
        cluster.add("w0")  # the machine comes back: a new raylet, the same sandbox root
        events["back"] = time.time()

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    summary = run_batch(cfg, console=Console(quiet=True))
    t.join(timeout=60)
    assert "back" in events, "the chaos thread did not get to kill the node"
    rows, samples = _tables(tmp_path / "out")
    _assert_once(rows, samples, 8)
    assert summary.redispatched >= 1
    # nothing the dead node was running when it died is on record: what it recorded, it
    # recorded before; its lost rollouts were recorded by a surviving (or the new) node
    on_dead = [r for r in rows if r["node"] == dead_id]
    assert all(r["finished_at"] < events["killed"] for r in on_dead), on_dead
    assert any(r["attempt"] >= 2 and r["node"] != dead_id for r in rows), rows
    # the node that came back got sandbox actors and ran rollouts
    back_id = cluster.node_id("w0")
    assert back_id != dead_id and any(r["node"] == back_id for r in rows), [r["node"] for r in rows]
    # the dead node's sandboxes were reaped once it was back, and reported as such
    what = summary.lost_nodes.get(dead_id, "")
    assert list(summary.lost_nodes) == [dead_id] and "when it rejoined" in what, summary.lost_nodes
    assert int(what.split("came back: ")[1].split()[0]) >= 1, what  # the sandboxes of its lost rollouts
    assert not _left(tmp_path / "sb")


def test_e2b_sandboxes_of_every_node_reach_their_own_nodes_gateway(cluster, tmp_path):
    """gateway.public_url as a template: each sandbox actor fills in its own node, so every
    node's E2B sandboxes reach that node's gateway; a fixed URL on two nodes is refused when
    the actors start, naming both (the config alone cannot tell how many nodes there are)."""
    import farm_helpers
    import ray

    from farm.actors.assembly import FarmActors
    from farm.errors import ConfigError

    ray.cloudpickle.register_pickle_by_value(farm_helpers)

    def actors(run_id: str, url: str) -> FarmActors:
        cfg = _cfg(tmp_path, run_id, limit=1).model_copy(deep=True)
        cfg.gateway.public_url = url
        return FarmActors(cfg, parts_factory=farm_helpers.FakeParts)

    per_node = actors("urls", "https://gw-{node_id}.example.com:{port}")
    try:
        per_node.start_sandbox_actors()
        where = [ray.get(ref) for ref in per_node.where.values()]
    finally:
        per_node.close()
    assert {w["node"] for w in where} == {cluster.node_id("w0"), cluster.node_id("w1")}
    for w in where:
        assert w["gateway_url"] == f"https://gw-{w['node']}.example.com:8700", w
    fixed = actors("fixedurl", "https://tunnel.example.com")
    try:
        with pytest.raises(ConfigError, match=r"sandbox actors farm-fixedurl-sandbox-\d and farm-fixedurl-sandbox-\d "
                                              r"\(node \w+\) would both be reached at https://tunnel.example.com"):
            fixed.start_sandbox_actors()
    finally:
        fixed.close()

