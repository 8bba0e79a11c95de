"""Where one-at-a-time rollouts go, and the summary they leave: `farm rollout` / `farm
serve` / farm.Rollouts write into the `rollouts` directory beside the config's output.dir
(run id `rollouts`), never into the directory a `farm run` of the same config writes, unless
an override names another; a session that stores rollouts is an invocation of its
directory, so summary.json's counts stay those of the rollouts table. Fast: real local
sandboxes, the real pipeline and reducer, an agent that only sleeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.config import load_config, load_single_config
from farm.errors import ConfigError
from farm.single import Rollouts
from farm.tasks.model import Task

from single_helpers import SleepParts, single_config

ROOT = Path(__file__).resolve().parents[2]


def _task(tid: str) -> Task:
    return Task(id=tid, instruction="sleep", verify_commands=["true"], metadata={"agent_s": 0.1})


def test_single_rollouts_have_their_own_directory_and_run_id(tmp_path):
    cfg = load_single_config(None)
    assert (cfg.output.dir, cfg.run_id) == ("runs/rollouts", "rollouts")
    assert (load_config(None).output.dir, load_config(None).run_id) == ("runs/local", "local")  # farm run's
    # the default config names farm run's runs/local: one rollout at a time goes beside it
    local = ROOT / "configs" / "local.yaml"
    assert load_config(local).output.dir == "runs/local"
    assert (load_single_config(local).output.dir, load_single_config(local).run_id) == ("runs/rollouts", "rollouts")
    path = tmp_path / "c.yaml"
    path.write_text("run_id: mine\noutput: {dir: /data/runs/swe}\n")
    cfg = load_single_config(path)  # the file's directory and run id are farm run's: on the same disk, its own
    assert (cfg.output.dir, cfg.run_id) == ("/data/runs/rollouts", "rollouts")
    cfg = load_single_config(path, ["output.dir=there"])  # told: there, its run id derived from it
    assert (cfg.output.dir, cfg.run_id) == ("there", "there")
    cfg = load_single_config(path, ["output.dir=there", "run_id=exp"])
    assert (cfg.output.dir, cfg.run_id) == ("there", "exp")
    service = Rollouts(str(local), tasks=[_task("a")], parts_factory=SleepParts, placement="local")
    assert service.out_dir == (Path.cwd() / "runs" / "rollouts").resolve() and service.cfg.run_id == "rollouts"
    service = Rollouts(str(local), overrides=[f"output.dir={tmp_path / 'mine'}"], tasks=[_task("a")],
                       parts_factory=SleepParts, placement="local")
    assert service.out_dir == tmp_path / "mine" and service.cfg.run_id == "mine"


def test_run_id_defaults_to_the_output_directorys_name(tmp_path):
    assert load_config(None, ["output.dir=runs/noop"]).run_id == "noop"
    assert load_config(None, ["output.dir=/data/farm runs/swe gym/"]).run_id == "swe-gym"  # a path component
    assert load_config(None, ["output.dir=runs/noop", "run_id=base"]).run_id == "base"  # set: kept
    for name in ("local", "local_codex", "local_opencode", "e2b", "hosted", "cluster"):
        cfg = load_config(ROOT / "configs" / f"{name}.yaml")
        assert cfg.run_id == Path(cfg.output.dir).name, name
        # the quickstart's baseline (--set output.dir=runs/noop) is a run of its own: its
        # sandboxes are labelled, and reaped, apart from a run of the same config
        assert load_config(ROOT / "configs" / f"{name}.yaml", ["output.dir=runs/noop"]).run_id == "noop", name


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
