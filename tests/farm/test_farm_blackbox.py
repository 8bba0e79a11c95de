"""`farm run` in black-box mode, as a user runs it (a subprocess with its own Ray): the
real CLI solves a demo task through farm's gateway, which passes each turn to a hosted
endpoint (testkit.hosted, over real HTTP) with the key read from the environment.
No engine is started, no Sample is written: a transcripts table instead, and the
rollouts table says mode=black_box. A refused key ends the rollout as auth_error."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from farm.output.writer import ROLLOUTS_TABLE, SAMPLES_TABLE, TRANSCRIPTS_TABLE
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from testkit.hosted import HostedFake, run_in_thread
from farm.output.shard_reader import ShardReader
from farm.trajectory.transcript import request_messages

from farm_raycluster import HeadCluster

pytestmark = [pytest.mark.slow, pytest.mark.starts_ray]
FARM = str(Path(sys.executable).parent / "farm")
KEY_ENV = "FARM_TEST_HOSTED_KEY"


@pytest.fixture(scope="module")
def demo_tasks():
    return list(load_tasks(TasksConfig(path="demo")).tasks)


def run_cli(tmp_path: Path, harness: str, endpoint: dict, key: str | None) -> tuple[int, str]:
    cfg = {
        "run_id": f"bb-{harness}",
        "tasks": {"path": "demo"},
        "harness": {"name": harness},
        # an engine nobody serves and a tokenizer that does not exist: starting either would fail the run
        "engine": {"mode": "external", "url": "http://127.0.0.1:9", "tokenizer": "/nonexistent/tokenizer",
                   "health_timeout_s": 5},
        "endpoints": {"hosted": endpoint},
        "endpoint": "hosted",
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb")}},
        "rollout": {"timeout_s": 300, "infra_retries": 0, "limit": 1},  # the first demo task
        "ray": {"num_sandbox_actors": 1, "reducer_flush_s": 0.2, "num_cpus": 2, "include_dashboard": False},
        "output": {"dir": str(tmp_path / "out")},
    }  # fmt: skip
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ray_tmp = tempfile.mkdtemp(prefix="fbb")
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    env.pop(KEY_ENV, None)
    if key is not None:
        env[KEY_ENV] = key
    try:
        res = subprocess.run([FARM, "run", str(path)], env=env, capture_output=True, text=True, timeout=400)
    finally:
        HeadCluster(ray_tmp, 0, 0, 0).stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return res.returncode, res.stdout + res.stderr


def table(out: Path, name: str) -> list[dict]:
    if not (out / name).is_dir():
        return []
    return ShardReader(out, name=name).read_table().to_pylist()


# OpenCode (chat) -> a responses endpoint passed here too (62 s); left out to keep the suite short.
@pytest.mark.parametrize("harness, kind", [("claude_code", "anthropic"), ("codex", "chat")])
def test_black_box_run_completes_without_samples(tmp_path, hf_tokenizer, demo_tasks, harness, kind):
    with run_in_thread(HostedFake(demo_tasks, hf_tokenizer, api_key="sk-hosted-123")) as fake:
        ep = {"kind": "anthropic" if kind == "anthropic" else "openai", "base_url": fake.base_url + "/v1",
              "model": "hosted-x", "api_key_env": KEY_ENV, "max_tokens": 8192}
        if kind != "anthropic":
            ep["api"] = kind
        code, log = run_cli(tmp_path, harness, ep, "sk-hosted-123")
        served = list(fake.requests)
    assert code == 0, log[-3000:]
    out = tmp_path / "out"
    (row,) = table(out, ROLLOUTS_TABLE)
    assert (row["status"], row["reward"], row["mode"], row["num_samples"]) == ("completed", 1.0, "black_box", 0), row
    assert table(out, SAMPLES_TABLE) == []  # nothing trainable
    turns = table(out, TRANSCRIPTS_TABLE)
    main = [t for t in turns if not t["side_request"]]
    assert len(main) >= 3 and row["turns"] == len(turns) and all(t["endpoint"] == "hosted" for t in turns)
    assert sum(1 for t in main if json.loads(t["response"]).get("tool_calls")) >= 2
    assert all(t["prompt_tokens"] > 0 and t["latency_ms"] > 0 for t in main)
    assert row["prompt_tokens"] == sum(t["prompt_tokens"] for t in turns)
    full = request_messages(turns)  # stored as deltas, rebuilt whole: every request holds the task's instruction
    assert all(t["extends_turn"] is not None for t in main[1:]) and all(
        any(m["role"] == "user" for m in msgs) for msgs, t in zip(full, turns) if not t["side_request"])
    # every turn went to the endpoint in its own protocol, with the key from the environment
    route = {"anthropic": "/messages", "chat": "/chat/completions", "responses": "/responses"}[kind]
    assert len(served) >= len(main) and all(p.endswith(route) for p, _, _ in served)
    # the rollout's artifacts hold the same turns, canonical, never trainable (farm.output.artifacts)
    lines = gzip.decompress((out / "artifacts" / row["rollout_id"] / "turns.jsonl.gz").read_bytes()).splitlines()
    kept = [json.loads(line) for line in lines]
    assert len(kept) == len(turns) and not any(t["trainable"] for t in kept)
    assert [t["prompt_tokens"] for t in kept] == [t["prompt_tokens"] for t in turns]
    # the key is nowhere in the output directory (the artifacts are gzip: read them unzipped)
    def text(p: Path) -> bytes:
        return gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    assert not [p for p in out.rglob("*") if p.is_file() and b"sk-hosted-123" in text(p)]


def test_black_box_refused_key_is_auth_error(tmp_path, hf_tokenizer, demo_tasks):
    with run_in_thread(HostedFake(demo_tasks, hf_tokenizer, api_key="sk-right")) as fake:
        ep = {"kind": "anthropic", "base_url": fake.base_url + "/v1", "model": "hosted-x", "api_key_env": KEY_ENV}
        code, log = run_cli(tmp_path, "claude_code", ep, None)
        assert code == 2 and f"${KEY_ENV}, which is not set" in log  # clear error, before anything starts
        assert not (tmp_path / "out").exists()
        code, log = run_cli(tmp_path, "claude_code", ep, "sk-wrong")
    assert code == 0, log[-3000:]
    (row,) = table(tmp_path / "out", ROLLOUTS_TABLE)
    assert (row["status"], row["mode"], row["num_samples"]) == ("auth_error", "black_box", 0), row
    assert "401" in row["reason"] and "sk-wrong" not in row["reason"]
    assert table(tmp_path / "out", SAMPLES_TABLE) == []
