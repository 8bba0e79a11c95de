"""Rows whose environment is a container image: which image (the row's field, the dataset's
name template), the image or the recipe (``tasks.images.prefer``), the dataset's layout, and
grading by the row's own eval script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from farm.grading.grader import between_test_markers
from farm.images.config import CONDA_TESTBED, SWEBENCH_NAME, DatasetImages, ImagesConfig
from farm.tasks.config import TasksConfig
from farm.tasks.loaders import load_tasks
from farm.tasks.model import GitSource, ImageSource

BASE = "a" * 40
TEST_PATCH = ("diff --git a/tests/test_x.py b/tests/test_x.py\n--- a/tests/test_x.py\n+++ b/tests/test_x.py\n"
              "@@ -1 +1,2 @@\n x = 1\n+y = 2\n")  # fmt: skip


def row(iid: str = "django__django-11099", repo: str = "django/django", version: str = "3.0", **extra) -> dict:
    return {"instance_id": iid, "repo": repo, "base_commit": BASE, "version": version, "problem_statement": "broken",
            "patch": "", "test_patch": TEST_PATCH, "FAIL_TO_PASS": json.dumps(["tests/test_x.py::test_y"]),
            "PASS_TO_PASS": "[]", **extra}  # fmt: skip


def load(tmp_path: Path, rows: list[dict], **cfg) -> list:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = load_tasks(TasksConfig(path=str(path), **cfg))
    assert not result.errors, result.errors
    return result.tasks


@pytest.mark.parametrize("field", ["image", "image_name", "docker_image"])
def test_a_row_naming_its_image_runs_in_it(tmp_path: Path, field: str):
    (task,) = load(tmp_path, [row(**{field: "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"})])
    assert task.workspace == ImageSource(image="swebench/sweb.eval.x86_64.django_1776_django-11099:latest",
                                         base_commit=BASE, activate=CONDA_TESTBED)  # fmt: skip
    assert task.workdir == "/testbed" and not task.setup_commands and task.python is None
    # the recipe book still says how django's tests run and read, without the venv it would have made
    assert task.log_parser == "parse_log_django" and task.metadata["recipe_reading"]
    assert task.test_command == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 test_x"


def test_the_recipe_wins_when_the_config_says_so(tmp_path: Path):
    image = {"image_name": "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"}
    (task,) = load(tmp_path, [row(**image)], images=ImagesConfig(prefer="recipe"), check_requirements=False)
    assert isinstance(task.workspace, GitSource) and task.setup_commands and task.metadata["recipe"] == "django/django@3.0"
    # a row with an image and no recipe for its repository uses the image whatever prefer says
    (other,) = load(tmp_path, [row(repo="acme/thing", **image)], images=ImagesConfig(prefer="recipe"))
    assert isinstance(other.workspace, ImageSource)


def test_a_datasets_name_template_and_its_layout(tmp_path: Path):
    images = ImagesConfig(registry="127.0.0.1:5000", datasets={
        "swegym": DatasetImages(name="xingyaoww/sweb.eval.x86_64.{instance_id_docker}:latest", workdir="/work",
                                activate="source /venv/bin/activate"),
        "swebench": DatasetImages(name=SWEBENCH_NAME)})  # fmt: skip
    (gym,) = load(tmp_path, [row("getmoto__moto-5752", "getmoto/moto")], format="swegym", images=images)
    assert gym.workspace == ImageSource(image="xingyaoww/sweb.eval.x86_64.getmoto_1776_moto-5752:latest",
                                        base_commit=BASE, activate="source /venv/bin/activate")  # fmt: skip
    assert gym.workdir == "/work" and gym.metadata["image_dataset"] == "swegym"
    (bench,) = load(tmp_path, [row("Acme__Thing-1", "acme/thing")], images=images)
    assert bench.workspace.image == "swebench/sweb.eval.x86_64.acme_1776_thing-1:latest"
    # without a template, a row that names no image keeps its git workspace (here on the host's
    # Python, knowingly: no recipe covers acme/thing)
    (plain,) = load(tmp_path, [row("acme__thing-2", "acme/thing")], python="host")
    assert isinstance(plain.workspace, GitSource)
    with pytest.raises(ValueError, match=r"unknown field \{nope\}"):
        DatasetImages(name="x/{nope}")


def test_swe_rebench_rows_by_their_images_namespace(tmp_path: Path):
    (task,) = load(tmp_path, [row("oemof__tespy-653", "oemof/tespy",
                                  docker_image="swerebench/sweb.eval.x86_64.oemof_1776_tespy-653:latest")])  # fmt: skip
    assert task.metadata["image_dataset"] == "swerebench" and task.workspace.activate == CONDA_TESTBED


def test_an_eval_script_grades_the_row(tmp_path: Path):
    script = "#!/bin/bash\nset -uxo pipefail\n: '>>>>> Start Test Output'\npytest -rA\n: '>>>>> End Test Output'\n"
    (task,) = load(tmp_path, [row(repo="acme/thing", image="acme:1", eval_script=script)])
    assert task.test_command == "{\n" + script.rstrip() + "\n} 2>&1" and task.metadata["graded_by"] == "eval_script"
    assert task.test_patch == TEST_PATCH  # farm's grader still guards the test files it touches
    log = ("+ git apply -v -\nPASSED tests/test_x.py::test_from_the_diff\n+ : '>>>>> Start Test Output'\n"
           "PASSED tests/test_x.py::test_y\n+ : '>>>>> End Test Output'\n+ git checkout\n")
    assert between_test_markers(log) == "PASSED tests/test_x.py::test_y\n"  # only what the markers hold is read
    assert between_test_markers("PASSED a::b\n") == "PASSED a::b\n"  # no markers: the whole log


def test_farm_rows_and_r2e_rows_keep_their_own_sources(tmp_path: Path):
    farm_row = {"id": "f1", "instruction": "x", "workspace": {"type": "image", "image": "mine:1"}, "workdir": "/src",
                "verify_commands": ["true"]}  # fmt: skip
    r2e = {"docker_image": "namanjain12/aiohttp_final:abc", "expected_output_json": json.dumps({"test_a": "PASSED"}),
           "problem_statement": "fix", "commit_hash": "d" * 40}  # fmt: skip
    farm_task, r2e_task = load(tmp_path, [farm_row, r2e])
    assert farm_task.workspace == ImageSource(image="mine:1") and farm_task.workdir == "/src"
    assert r2e_task.workspace == ImageSource(image="namanjain12/aiohttp_final:abc") and r2e_task.workdir == "/testbed"
    # R2E-Gym's held-out tests are linked into the repository for the test run only, as its runtime does
    assert r2e_task.test_command == ("rm -rf r2e_tests && ln -s /r2e_tests r2e_tests && { bash run_tests.sh\n}; "
                                     "rc=$?; rm -f r2e_tests; exit $rc")  # fmt: skip
