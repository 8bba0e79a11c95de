"""A dataset row never runs on farm's own Python unasked (farm.tasks.environment): rows as
SWE-Gym, SWE-smith and SWE-bench publish them, loaded the way `farm run` loads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.config import FarmConfig
from farm.run.tasks import load_task_file
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks

BUG = "diff --git a/moto/core.py b/moto/core.py\n--- a/moto/core.py\n+++ b/moto/core.py\n@@ -1 +1 @@\n-a\n+b\n"
TESTS = "diff --git a/tests/test_s3.py b/tests/test_s3.py\n--- a/tests/test_s3.py\n+++ b/tests/test_s3.py\n@@ -1 +1 @@\n-a\n+b\n"


def moto_row(**extra) -> dict:
    """A SWE-Gym row as published: SWE-bench's fields, no image, no setup (getmoto/moto: not in the book)."""
    row = {
        "instance_id": "getmoto__moto-5752", "repo": "getmoto/moto", "base_commit": "b" * 40, "version": "4.0",
        "problem_statement": "s3 is broken", "patch": BUG, "test_patch": TESTS, "hints_text": "",
        "created_at": "2022-12-08", "environment_setup_commit": "c" * 40,
        "FAIL_TO_PASS": json.dumps(["tests/test_s3.py::test_get"]), "PASS_TO_PASS": json.dumps([]),
    }  # fmt: skip
    row.update(extra)
    return row


def smith_row(**extra) -> dict:
    row = {
        "instance_id": "getmoto__moto.694ce1f4.func_pm_remove_cond__x1", "repo": "swesmith/getmoto__moto.694ce1f4",
        "patch": BUG, "FAIL_TO_PASS": ["tests/test_s3.py::test_get"], "PASS_TO_PASS": [],
        "problem_statement": "s3 get fails", "created_at": "2025-03-14",
    }  # fmt: skip
    row.update(extra)
    return row


def write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_config(path: Path, backend: str = "local", **tasks) -> FarmConfig:
    return FarmConfig.model_validate({"tasks": {"path": str(path), **tasks}, "sandbox": {"backend": backend}})


def test_a_row_nothing_provides_an_environment_for_is_refused_naming_the_ways(tmp_path: Path) -> None:
    path = write(tmp_path, [
        moto_row(),
        moto_row(instance_id="getmoto__moto-2", setup_commands=["pip install -e ."]),
        moto_row(instance_id="getmoto__moto-3", image_name="xingyaoww/sweb.eval.x86_64.getmoto_s_moto-3"),
        moto_row(instance_id="getmoto__moto-4", docker_image="registry.local/moto:4"),
        moto_row(instance_id="getmoto__moto-5", image="registry.local/moto:5"),
        smith_row(),
        smith_row(instance_id="getmoto__moto.694ce1f4.x2", image_name="swebench/swesmith.x86_64.getmoto_1776_moto.694ce1f4"),
    ])  # fmt: skip
    result = load_task_file(run_config(path))
    assert [t.id for t in result.tasks] == ["getmoto__moto-2", "getmoto__moto-3", "getmoto__moto-4", "getmoto__moto-5",
                                            "getmoto__moto.694ce1f4.x2"]  # fmt: skip
    assert [(e.line, e.field) for e in result.errors] == [(1, "environment"), (6, "environment")]
    message = str(result.errors[0])
    for way in ("a recipe", "tasks.recipes", "setup_commands", "image / image_name / docker_image", "tasks.python: host"):
        assert way in message, message
    assert "getmoto/moto 4.0" in message and "farm's own Python" in message and "(swebench row)" in message
    by_id = {t.id: t for t in result.tasks}
    assert by_id["getmoto__moto-3"].metadata["docker_image"] == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-3"
    assert by_id["getmoto__moto-4"].metadata["docker_image"] == "registry.local/moto:4"
    # SWE-smith's image_name is the row's image: its environment, locally as on E2B (tasks.images.prefer)
    smith = by_id["getmoto__moto.694ce1f4.x2"]
    assert smith.metadata["docker_image"] == "swebench/swesmith.x86_64.getmoto_1776_moto.694ce1f4"
    assert smith.workspace.type == "image" and smith.workspace.image == smith.metadata["docker_image"]


def test_the_user_says_where_tests_run_and_e2b_uses_the_conventional_image(tmp_path: Path) -> None:
    path = write(tmp_path, [moto_row(), smith_row()])
    for python in ("host", "3.11", "/opt/py/bin/python", "none"):  # any interpreter named: the user's call
        assert len(load_task_file(run_config(path, python=python)).tasks) == 2, python
    # on E2B the template is built from SWE-bench's image by instance id: that is its environment
    e2b = load_task_file(run_config(path, backend="e2b"))
    assert [t.id for t in e2b.tasks] == ["getmoto__moto-5752"] and e2b.tasks[0].metadata["docker_image_by_convention"]
    assert [(e.line, e.field) for e in e2b.errors] == [(2, "environment")]  # SWE-smith has no such convention


def test_farm_rows_and_the_demo_set_run_with_tasks_python_as_documented(tmp_path: Path, tasks_cfg: TasksConfig) -> None:
    """farm's own format says where its commands run (tasks.python): the demo set (pure Python,
    tests need only pytest) and the own-task examples load as they are."""
    demo = load_tasks(tasks_cfg)
    assert demo.ok and len(demo.tasks) == 13
    row = {"id": "calc-divide", "instruction": "fix it", "workspace": {"type": "git", "url": str(tmp_path), "base_commit": "a" * 40},
           "test_command": "python -m pytest -rA test_calc.py", "fail_to_pass": ["test_calc.py::test_divide"]}  # fmt: skip
    assert load_task_file(run_config(write(tmp_path, [row]))).ok


async def test_a_swesmith_row_finds_its_mirror_and_nothing_is_fetched_unasked(tmp_path: Path) -> None:
    """A SWE-smith row's repository (swesmith/<owner>__<repo>.<commit>) is looked up as
    swesmith__<owner>__<repo>.<commit>.git in tasks.mirror_dir; without it, nothing is fetched
    (tasks.fetch is off unless asked) and the error says where farm looked."""
    import subprocess

    from farm.errors import RepositoryNotFound
    from farm.tasks.runtime import TaskRuntime

    mirrors = tmp_path / "mirrors"
    subprocess.run(["git", "init", "-q", "--bare", str(mirrors / "swesmith__getmoto__moto.694ce1f4.git")], check=True)
    # no image: its repository comes from the mirror (tests on the host's Python, knowingly)
    cfg = TasksConfig(path=str(write(tmp_path, [smith_row()])), python="host",
                      mirror_dir=str(mirrors), cache_dir=str(tmp_path / "cache"))  # fmt: skip
    (task,) = load_tasks(cfg).tasks
    runtime = TaskRuntime.from_config(cfg)
    assert await runtime.repos.locate(task.workspace) == mirrors / "swesmith__getmoto__moto.694ce1f4.git"
    other = task.workspace.model_copy(update={"repo": "swesmith/getmoto__moto.0000aaaa"})
    with pytest.raises(RepositoryNotFound, match=r"swesmith__getmoto__moto.0000aaaa.git.*fetching is off \(tasks.fetch\)"):
        await runtime.repos.locate(other)
    assert not (tmp_path / "cache" / "repos").exists()  # no clone was tried
