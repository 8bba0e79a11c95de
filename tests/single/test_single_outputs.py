"""Where one-at-a-time rollouts go, and the summary they leave: `farm rollout` / `farm
serve` / farm.Rollouts default to runs/rollouts (run id `rollouts`), never `farm run`'s
runs/local; a session that stores rollouts is an invocation of its directory, so
summary.json's counts stay those of the rollouts table. Fast: real local sandboxes, the
real pipeline and reducer, an agent that only sleeps."""

from __future__ import annotations

import json

import pytest

from farm.config import SINGLE_DEFAULTS, load_config
from farm.errors import ConfigError
from farm.single import Rollouts
from farm.tasks.model import Task

from single_helpers import SleepParts, single_config


def _task(tid: str) -> Task:
    return Task(id=tid, instruction="sleep", verify_commands=["true"], metadata={"agent_s": 0.1})


def test_single_rollouts_have_their_own_default_directory_and_run_id(tmp_path):
    cfg = load_config(None, defaults=SINGLE_DEFAULTS)
    assert (cfg.output.dir, cfg.run_id) == ("runs/rollouts", "rollouts")
    assert (load_config(None).output.dir, load_config(None).run_id) == ("runs/local", "local")  # farm run's
    path = tmp_path / "c.yaml"
    path.write_text("run_id: mine\noutput: {dir: here}\n")
    cfg = load_config(path, defaults=SINGLE_DEFAULTS)  # the file wins
    assert (cfg.output.dir, cfg.run_id) == ("here", "mine")
    cfg = load_config(None, ["output.dir=there"], defaults=SINGLE_DEFAULTS)  # and --set
    assert (cfg.output.dir, cfg.run_id) == ("there", "rollouts")
    service = Rollouts(None, tasks=[_task("a")], parts_factory=SleepParts, placement="local")
    assert service.out_dir.name == "rollouts" and service.cfg.run_id == "rollouts"


async def _session(cfg, tids: list[str], *, abort: bool = False) -> None:
    async with Rollouts(cfg, tasks=[_task(t) for t in ("a", "b", "c")], parts_factory=SleepParts) as service:
        for tid in tids:
            handle = await service.start(tid)
            if abort:
                await handle.abort()
            else:
                assert (await handle.finalize())["stored"]


async def test_each_session_keeps_the_summary_true(tmp_path):
    cfg = single_config(tmp_path)
    out = tmp_path / "out"
    await _session(cfg, ["a", "b"])
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["planned"], summary["finished"], summary["cumulative"]["rollouts"]) == (2, 2, 2)
    await _session(cfg, ["c"])  # rows added by another invocation: the summary follows the table
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["finished"], summary["cumulative"]["rollouts"], summary["cumulative"]["invocations"]) == (1, 3, 2)
    assert summary["cumulative"]["by_status"] == {"completed": 3}
    lines = [json.loads(ln) for ln in (out / "invocations.jsonl").read_text().splitlines()]
    assert [ln["command"] for ln in lines] == ["rollouts", "rollouts"] and lines[1]["finished"] == 1
    before = (out / "summary.json").read_text()
    await _session(cfg, ["a"], abort=True)  # nothing stored: nothing to change
    assert (out / "summary.json").read_text() == before and len((out / "invocations.jsonl").read_text().splitlines()) == 2


async def test_a_session_on_another_task_file_is_refused(tmp_path):
    cfg = single_config(tmp_path)
    first = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"path": str(tmp_path / "a.jsonl")})})
    await _session(first, ["a"])
    other = cfg.model_copy(update={"tasks": cfg.tasks.model_copy(update={"path": str(tmp_path / "b.jsonl")})})
    with pytest.raises(ConfigError, match="output.mixed_tasks=allow"):
        await _session(other, ["b"])
    allowed = other.model_copy(update={"output": other.output.model_copy(update={"mixed_tasks": "allow"})})
    await _session(allowed, ["b"])
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["cumulative"]["rollouts"] == 2
