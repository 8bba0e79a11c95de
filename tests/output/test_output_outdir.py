"""One output directory holds one task set: a run naming another task file than the one
whose rollouts the directory holds is refused before anything starts (or, asked for,
warned about); run_config.yaml records the task file resolved."""

from __future__ import annotations

import logging

import pytest
import yaml

from farm.cli import main
from farm.config import load_config
from farm.errors import ConfigError
from farm.output.outdir import check_tasks_source, write_run_config

from farm_helpers import make_result, reducer_config


async def _recorded(out) -> None:
    from farm.actors.reducer import ReducerActor

    red = ReducerActor(reducer_config(out), metrics=False)
    await red.submit(make_result("demo-x.0"))
    await red.close()


async def test_another_task_file_is_refused_or_warned_about(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    first = load_config(None, ["tasks.path=mine.jsonl"])
    out.mkdir()
    write_run_config(first, out)
    assert yaml.safe_load((out / "run_config.yaml").read_text())["tasks"]["path"] == str(tmp_path / "mine.jsonl")
    other = load_config(None, ["tasks.path=demo"])
    assert check_tasks_source(other, out) is None  # nothing recorded yet: nothing to mix
    await _recorded(out)
    assert check_tasks_source(load_config(None, ["tasks.path=./mine.jsonl"]), out) is None  # the same file
    with pytest.raises(ConfigError) as err:
        check_tasks_source(other, out)
    msg = str(err.value)
    assert f"holds rollouts of tasks.path={tmp_path / 'mine.jsonl'}" in msg and "this run's tasks.path is demo" in msg
    assert "--set output.mixed_tasks=allow" in msg
    allowed = load_config(None, ["tasks.path=demo", "output.mixed_tasks=allow"])
    with caplog.at_level(logging.WARNING, logger="farm.output.outdir"):
        assert "holds rollouts of" in check_tasks_source(allowed, out)
    assert "output.mixed_tasks: allow" in caplog.text


async def test_farm_run_refuses_before_starting_anything(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "run_config.yaml").write_text(yaml.safe_dump({"tasks": {"path": "demo"}}))
    await _recorded(out)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"tasks": {"path": str(tmp_path / "t.jsonl")}, "output": {"dir": str(out)}}))
    assert main(["run", str(cfg)]) == 1
    assert "holds rollouts of tasks.path=demo" in capsys.readouterr().err
    assert yaml.safe_load((out / "run_config.yaml").read_text()) == {"tasks": {"path": "demo"}}  # untouched
    assert not (out / "invocations.jsonl").exists()
