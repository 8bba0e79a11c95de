"""`farm rollout` as a user runs it: default config (demo tasks, oracle engine, local
sandboxes, Claude Code), a fresh working directory, a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from farm.output.writer import ROLLOUTS_TABLE, TRANSCRIPTS_TABLE
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from testkit.hosted import HostedFake, run_in_thread
from farm.output.shard_reader import ShardReader
from single_helpers import stored_ids

pytestmark = pytest.mark.slow


def farm(tmp_path, *args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
    return subprocess.run([sys.executable, "-m", "farm", "rollout", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def test_farm_rollout_json_on_the_default_config(tmp_path):
    proc = farm(tmp_path, "--task", "demo-wordfreq", "--harness", "claude_code", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "completed" and out["reward"] == 1.0, out
    assert out["turns"] >= 2 and out["tokens"]["output"] > 0 and out["duration_s"] > 0
    progress = [line for line in proc.stderr.splitlines() if line.startswith("demo-wordfreq.0 turn ")]
    assert len(progress) == out["turns"]  # one progress line per turn
    assert out["outputs"]["output_dir"] == str(tmp_path / "runs" / "rollouts")  # not `farm run`'s runs/local
    assert stored_ids(tmp_path / "runs" / "rollouts") == ({"demo-wordfreq.0"}, {"demo-wordfreq.0"})


def test_farm_rollout_bad_arguments_fail_before_starting_anything(tmp_path):
    proc = farm(tmp_path, "--task", "nope", "--json", timeout=120)
    assert proc.returncode == 2 and "unknown task 'nope'" in proc.stderr and proc.stdout == ""
    proc = farm(tmp_path, "--task", "demo-wordfreq", "--endpoint", "hosted", timeout=120)
    assert proc.returncode == 2 and "endpoint 'hosted' is not in the endpoints catalog" in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_farm_rollout_on_a_black_box_endpoint_writes_no_samples(tmp_path, hf_tokenizer):
    """--endpoint naming a hosted endpoint (testkit.hosted: the Anthropic protocol over
    real HTTP): Claude Code solves the task through it; graded, a transcript, no Sample."""
    tasks = list(load_tasks(TasksConfig(path="demo")).tasks)
    with run_in_thread(HostedFake(tasks, hf_tokenizer, api_key="sk-hosted-123")) as fake:
        endpoint = {"kind": "anthropic", "base_url": fake.base_url + "/v1", "model": "hosted-x",
                    "api_key_env": "FARM_TEST_HOSTED_KEY"}  # fmt: skip
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"endpoints": {"hosted": endpoint}}))
        args = ("--config", "cfg.yaml", "--task", "demo-wordfreq", "--harness", "claude_code", "--endpoint", "hosted")
        unset = farm(tmp_path, *args, "--json", timeout=120, env={"FARM_TEST_HOSTED_KEY": ""})
        proc = farm(tmp_path, *args, "--json", env={"FARM_TEST_HOSTED_KEY": "sk-hosted-123"})
        served = list(fake.requests)
    assert unset.returncode == 2 and "$FARM_TEST_HOSTED_KEY, which is not set" in unset.stderr
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert (out["status"], out["reward"]) == ("completed", 1.0), out
    assert out["turns"] >= 2 and len(served) >= out["turns"]
    run_dir = tmp_path / "runs" / "rollouts"
    assert stored_ids(run_dir) == (set(), {"demo-wordfreq.0"})  # a rollouts row, no Sample
    row = ShardReader(run_dir, name=ROLLOUTS_TABLE).read_table().to_pylist()[0]
    assert row["mode"] == "black_box" and row["num_samples"] == 0
    assert ShardReader(run_dir, name=TRANSCRIPTS_TABLE).read_table().num_rows == row["turns"] >= out["turns"]
