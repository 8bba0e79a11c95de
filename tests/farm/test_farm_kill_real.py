"""Kill a SandboxActor mid-run with the REAL parts: the real gateway, the scripted
engine behind the real sglang-router, Claude Code in real local sandboxes, real
grading. The killed actor's rollouts are re-dispatched and still end exactly once, and
nothing of the run is left: no sandbox directory, no sandboxed process, no CLI, no actor.
(test_farm_ray.py kills actors under stand-in parts; this one leaves real orphans.)"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import ray
from rich.console import Console

from farm.config import FarmConfig
from farm.actors.ray_cluster import actor_name
from farm.run.batch import run_batch
from farm.harnesses.config import HarnessConfig
from farm.output.writer import ROLLOUTS_TABLE, SAMPLES_TABLE
from farm.sandboxes.local import LABELS_FILE, MARKER_ENV
from farm.output.manifest import default_manifest_name, read_manifest
from farm.output.shard_reader import ShardReader

from test_farm_e2e import check_output

pytestmark = pytest.mark.slow
N_ROLLOUTS = 3  # sandbox-0 (the victim) takes the first and the third


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    """The session's shared local Ray (tests/conftest.py)."""


def _config(tmp_path: Path, run_id: str) -> FarmConfig:
    return FarmConfig.model_validate({
        "run_id": run_id,
        "tasks": {"path": "demo"},
        "harness": {"name": "claude_code"},
        # A slow first token keeps every agent in flight for a few seconds.
        "engine": {"mode": "simulator", "policy": "oracle",
                   "simulator": {"record_path": str(tmp_path / "rec"), "latency": {"ttft_s": 1.5}}},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb")}},
        "rollout": {"limit": N_ROLLOUTS, "concurrency": 2, "timeout_s": 600},
        "ray": {"num_sandbox_actors": 2, "reducer_flush_s": 0.2},
        "output": {"dir": str(tmp_path / "out")},
    })  # fmt: skip


# --- the host process table ---------------------------------------------------------
def _proc(pid: int, what: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{what}", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and int(e.name) != os.getpid()]


def _run_processes(sandbox_ids: set[str], base_dir: Path | None = None) -> list[tuple[int, str]]:
    """Live processes of this run's sandboxes: their marker names one of ``sandbox_ids``,
    or their command line or environment mention the run's sandbox ``base_dir``."""
    markers = {f"{MARKER_ENV}={sid}".encode() for sid in sandbox_ids}
    base = str(base_dir).encode() if base_dir is not None else None
    found = []
    for pid in _pids():
        env, cmd = _proc(pid, "environ"), _proc(pid, "cmdline")
        if markers.intersection(env.split(b"\0")) or (base is not None and (base in env or base in cmd)):
            found.append((pid, cmd.replace(b"\0", b" ")[:200].decode(errors="replace")))
    return found


NPM_CACHE = str(Path(HarnessConfig().npm_cache_dir).expanduser().resolve())


CLI_NAMES = {"claude", "codex", "opencode"}


def _cli_processes(sandbox_ids: set[str], base_dir: Path | None = None) -> list[tuple[int, str]]:
    """The coding-agent CLIs among ``_run_processes``: run from farm's npm cache, or from
    the copy the harness uploads into the sandbox when the cache is hidden (under /tmp)."""
    return [
        (pid, cmd)
        for pid, cmd in _run_processes(sandbox_ids, base_dir)
        if NPM_CACHE in cmd or os.path.basename(cmd.split(" ", 1)[0]) in CLI_NAMES
    ]


class SandboxWatch(threading.Thread):
    """Records every sandbox of the run (its labels and the pid of the actor that made
    it) and, once the victim actor has two agents running their CLI, kills the actor."""

    def __init__(self, tmp_path: Path, run_id: str, victim: str, *, restart: bool) -> None:
        super().__init__(daemon=True)
        self.run_dir = tmp_path / "sb" / run_id
        self.victim = victim
        self.restart = restart
        self.seen: dict[str, dict] = {}
        self.victim_pid: int | None = None
        self.killed: list[str] = []  # rollout ids whose agent ran in the victim when it died
        self.stop = threading.Event()

    def _scan(self) -> None:
        for d in self.run_dir.iterdir() if self.run_dir.exists() else []:
            if d.name not in self.seen and (d / LABELS_FILE).exists():
                try:
                    self.seen[d.name] = json.loads((d / LABELS_FILE).read_text())
                except (OSError, ValueError):
                    pass

    def _victim_agents_running(self) -> list[str]:
        """Rollouts whose CLI runs in a sandbox the victim made."""
        mine = {sid: info["labels"]["rollout_id"] for sid, info in self.seen.items()
                if info["farm_pid"] == self.victim_pid and info["labels"]["purpose"] == "agent"}  # fmt: skip
        if not mine:
            return []
        with_cli = {_proc(pid, "environ") for pid, _ in _cli_processes(set(mine))}
        return [rid for sid, rid in mine.items() if any(f"{MARKER_ENV}={sid}".encode() in env for env in with_cli)]

    def run(self) -> None:
        deadline = time.monotonic() + 180
        while not self.stop.is_set() and time.monotonic() < deadline:
            self._scan()
            if not self.killed:
                if self.victim_pid is None:
                    try:
                        victim = ray.get_actor(self.victim, namespace="farm")
                        self.victim_pid = ray.get(victim.__ray_call__.remote(lambda _self: os.getpid()), timeout=30)
                    except Exception:  # not started yet
                        pass
                elif len(self._victim_agents_running()) >= 2:
                    time.sleep(1.0)  # let the CLIs talk to the gateway a little
                    self.killed = self._victim_agents_running()
                    ray.kill(ray.get_actor(self.victim, namespace="farm"), no_restart=not self.restart)
            time.sleep(0.1)  # poll: the chaos thread's loop ends with the run


def _table(out: Path, name: str) -> list[dict]:
    reader = ShardReader(out, name=name)
    return reader.read_table().to_pylist() if reader.entries() else []


def _manifest_ids(out: Path, table: str) -> list[str]:
    entries = read_manifest(out / default_manifest_name(table)).entries
    return [rid for e in entries for rid in e.rollout_ids]


def _wait_until_empty(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while (left := what()) and time.monotonic() < deadline:
        time.sleep(0.2)  # poll: the loop's deadline bounds the wait
    return left


# restarted: Ray restarts the actor (a crash within ray.actor_max_restarts); dead_for_good:
# it never comes back (restarts used up, its node gone): the re-dispatches must avoid it.
@pytest.mark.parametrize("restart", [True, False], ids=["restarted", "dead_for_good"])
def test_killed_sandbox_actor_with_real_parts(tmp_path, restart):
    run_id = f"kill-{'restarted' if restart else 'dead'}"
    victim = actor_name(run_id, "sandbox-0")
    cfg = _config(tmp_path, run_id)
    watch = SandboxWatch(tmp_path, run_id, victim, restart=restart)
    watch.start()
    try:
        summary = run_batch(cfg, console=Console(quiet=True))
    finally:
        watch.stop.set()
        watch.join(timeout=10)
    assert len(watch.killed) >= 2, f"the victim never had two agents running: {watch.seen}"
    out = tmp_path / "out"

    # Every rollout ended exactly once, completed and resolved; the killed ones as attempt 2.
    rows = _table(out, ROLLOUTS_TABLE)
    ids = [r["rollout_id"] for r in rows]
    assert len(ids) == N_ROLLOUTS == len(set(ids)) == summary.planned, ids
    assert summary.by_status == {"completed": N_ROLLOUTS} and summary.resolved == N_ROLLOUTS, (
        summary, [(r["rollout_id"], r["status"], r["attempt"], r["reason"]) for r in rows])
    assert summary.redispatched >= len(watch.killed)
    attempts = {r["rollout_id"]: r["attempt"] for r in rows}
    assert all(attempts[rid] >= 2 for rid in watch.killed), (watch.killed, attempts)
    if not restart:
        assert victim not in {r["actor"] for r in rows}
    rows, samples = check_output(tmp_path, expect_resolved=True)  # tokens, rewards, grading reports
    assert {s.rollout_id for s in samples} <= {r["rollout_id"] for r in rows if r["status"] == "completed"}
    for s in samples:
        assert s.metadata["attempt"] == attempts[s.rollout_id]
    for table in (SAMPLES_TABLE, ROLLOUTS_TABLE):
        in_manifest = _manifest_ids(out, table)
        assert sorted(in_manifest) == sorted(set(in_manifest)), (table, in_manifest)
    assert sorted(_manifest_ids(out, ROLLOUTS_TABLE)) == sorted(ids)

    # Nothing of the run is left: sandboxes, their processes, CLIs, actors.
    sandbox_ids = set(watch.seen) | {r["sandbox_id"] for r in rows if r["sandbox_id"]}
    assert {info["farm_pid"] for info in watch.seen.values()} >= {watch.victim_pid}
    run_dir = tmp_path / "sb" / run_id
    assert not (list(run_dir.iterdir()) if run_dir.exists() else []), list(run_dir.iterdir())
    assert not _run_processes(sandbox_ids, tmp_path / "sb")
    assert not _cli_processes(sandbox_ids, tmp_path / "sb")
    left = _wait_until_empty(
        lambda: [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"farm-{run_id}-")]
    )
    assert not left, left
