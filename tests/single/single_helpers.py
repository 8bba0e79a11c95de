"""Config and checks shared by the farm.single tests (imported by plain name)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from farm.config import FarmConfig

# A verifier that rewards the file the inline task's ``files`` put in the workspace.
INLINE = {
    "id": "inline-greeting",
    "instruction": "Say hello, then stop. Do not change any file.",
    "files": {"greeting.txt": "hello\n"},
    "setup": ["test -f greeting.txt"],
    "verifier": 'grep -q hello greeting.txt && echo 0.5 > "$FARM_REWARD_FILE"',
    "agent_timeout_s": 120,
}


def single_config(tmp_path: Path, *, concurrency: int = 4, ttft_s: float = 0.3) -> FarmConfig:
    """The default config (demo tasks, oracle engine, local sandboxes), one engine worker,
    a slower first token so that a rollout is reliably still running after its first turn."""
    return FarmConfig.model_validate({
        "run_id": "single",
        "engine": {"simulator": {"workers": 1, "latency": {"ttft_s": ttft_s}}},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb")}},
        "rollout": {"concurrency": concurrency, "timeout_s": 300},
        "ray": {"reducer_flush_s": 0.1},
        "output": {"dir": str(tmp_path / "out")},
    })


def stored_ids(out_dir: Path) -> tuple[set[str], set[str]]:
    """(rollout ids with Samples, rollout ids with a rollouts-table row)."""
    from farm.output.writer import ROLLOUTS_TABLE
    from farm.output.reader import open_sample_reader
    from farm.output.shard_reader import ShardReader

    if not (out_dir / "manifest.jsonl").exists():
        return set(), set()
    samples = open_sample_reader(out_dir).read_table().column("rollout_id").to_pylist()
    rows = ShardReader(out_dir, name=ROLLOUTS_TABLE).read_table().column("rollout_id").to_pylist()
    return set(samples), set(rows)


def sandbox_left(tmp_path: Path, sandbox_id: str) -> bool:
    """Whether a directory named ``sandbox_id`` is still under the sandboxes' base dir.
    ``os.walk`` skips directories that vanish under it: other rollouts' sandboxes are
    created and removed while a test looks (``Path.rglob`` raised FileNotFoundError then)."""
    return any(sandbox_id in dirs for _, dirs, _ in os.walk(tmp_path / "sb"))


class SleepParts:
    """Rollout parts without engine or CLI, for the service's own bookkeeping: a real
    local sandbox whose 'agent' sleeps ``task.metadata['agent_s']``; ``task.metadata['boom']``
    makes the agent phase fail like an actor bug would (outside the pipeline's mapping)."""

    def __init__(self, cfg, engine_url, *, secrets=None, on_sandbox_created=None):
        self.cfg = cfg

    async def start(self) -> str:
        return "http://no-gateway"

    async def stop(self) -> None:
        return None

    async def create_sandbox(self, spec, purpose):
        from farm.sandboxes.base import SandboxSpec
        from farm.sandboxes.factory import create_sandbox

        return await create_sandbox(self.cfg.sandbox, SandboxSpec(labels={"run_id": spec.run_id, "purpose": purpose}))

    async def prepare(self, sb, spec):
        return None

    async def open_session(self, spec):
        return spec.rollout_id

    async def run_agent(self, sb, spec, secret, budget_s, workspace):
        from farm.rollout.pipeline import AgentEnd

        res = await (await sb.start(f"sleep {spec.task.metadata.get('agent_s', 0.1)}")).wait(timeout=budget_s)
        return AgentEnd(exit_code=res.exit_code)

    async def capture(self, sb, spec, workspace):
        return ""

    async def close_session(self, secret):
        return None

    async def grade(self, spec, diff):
        from farm.rollout.pipeline import Grade

        return Grade(reward=1.0, report={"resolved": True})


@contextmanager
def serve(tmp_path: Path, token: str, *flags: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``farm serve [flags]`` in a subprocess on a free port with ``single_config`` as its
    config file: (its base URL, the process); stopped as a user would (SIGTERM: its
    sandboxes closed), then for sure. The file's ``output.dir`` (``out``) is `farm run`'s:
    the server writes beside it, into ``tmp_path / "rollouts"``, and says so first."""
    cfg = single_config(tmp_path, concurrency=8)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "FARM_SERVE_TOKEN": token}
    proc = subprocess.Popen([sys.executable, "-m", "farm", "serve", *flags, "--config", str(path), "--port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=open(tmp_path / "serve.err", "w"), text=True)
    try:
        line = proc.stdout.readline()
        said = (tmp_path / "serve.err").read_text()
        assert line.startswith("farm serve: listening on http://127.0.0.1:"), said
        assert f"farm serve: run rollouts, rollouts written to {tmp_path / 'rollouts'}\n" in said, said
        yield line.split()[4], proc
    finally:
        if proc.poll() is None:  # a failed test: stop it as a user would (its sandboxes closed), then for sure
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
