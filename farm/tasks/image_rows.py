"""Rows whose environment is a container image: which image, and the image or the recipe.

A row names its image (``image``, ``image_name``, ``docker_image``), or its dataset names
images by convention (``tasks.images.datasets.<dataset>.name``, from the instance id). Such a
row's task runs in the image: its workspace is the image's repository (``workdir``,
``/testbed``) at the row's base commit, and every command starts in the environment the
dataset's activation leaves (``conda activate testbed``). A row with an image and a recipe
for its repository-version takes the one ``tasks.images.prefer`` says (default: the image).

Grading in the image: a row's own ``eval_script`` (SWE-bench's harness script, which
activates the environment, applies the test patch and runs the tests between its
``>>>>> Start Test Output`` / ``End Test Output`` markers) is the test command; else the
row's test command or pytest over its test files, read with its ``log_parser``; a recipe
still says how its repository's tests are run and read (its ``log_parser``, its test command
without the venv it activates: the image has its own environment).
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any

from farm.images.config import DatasetImages, ImagesConfig
from farm.tasks.formats import named_image
from farm.tasks.model import GitSource, ImageSource, Task
from farm.tasks.recipes import RecipeBook, apply_recipe, fill_test_command

# the recipe book's test commands run the spec's command in the venv the recipe made
_VENV_ACTIVATION = re.compile(r"^\s*(?:\.|source)\s+\.venv/bin/activate\s*&&\s*")


def name_fields(task: Task, row: dict[str, Any]) -> dict[str, str]:
    """What an image name template may use (``farm.images.config.NAME_FIELDS``)."""
    src = task.workspace
    repo = str(row.get("repo") or (src.repo if isinstance(src, GitSource) and src.repo else ""))
    commit = str(row.get("base_commit") or (src.base_commit if isinstance(src, GitSource) else "") or "")
    return {
        "instance_id": task.id,
        "instance_id_docker": task.id.replace("__", "_1776_").lower(),
        "repo": repo,
        "repo_docker": repo.replace("/", "_1776_").lower(),
        "base_commit": commit,
        "commit8": commit[:8],
    }


def dataset_of(fmt: str, image: str | None) -> str:
    """The dataset whose layout applies: the row format, SWE-rebench's by its images' namespace."""
    if fmt == "swebench" and image and image.split("/")[-2:-1] == ["swerebench"]:
        return "swerebench"
    return fmt


def image_for(task: Task, row: dict[str, Any], fmt: str, images: ImagesConfig) -> str | None:
    src = task.workspace
    if isinstance(src, ImageSource):
        return src.image
    named = named_image(row)
    if named:
        return named
    template = images.dataset(fmt).name
    return template.format(**name_fields(task, row)) if template else None


def with_environment(
    task: Task, row: dict[str, Any], fmt: str, *, images: ImagesConfig, book: RecipeBook, check_requirements: bool,
) -> Task:
    """``task`` with its environment: its image's, or its recipe's (``apply_recipe``)."""
    image = None if fmt == "farm" else image_for(task, row, fmt, images)  # farm rows say their environment
    if image is None:
        return apply_recipe(task, book, check_requirements=check_requirements)
    dataset = dataset_of(fmt, image)
    src = task.workspace
    match = None
    if isinstance(src, GitSource) and src.repo and book:
        match = book.lookup(src.repo, str(task.metadata.get("version") or ""))
    if images.prefer == "recipe" and match is not None:
        return apply_recipe(task, book, check_requirements=check_requirements)
    task = in_image(task, image, images.dataset(dataset), dataset)
    if match is not None:
        task = _recipe_reading(task, match.recipe)
    return task


def in_image(task: Task, image: str, layout: DatasetImages, dataset: str) -> Task:
    """``task`` run in ``image``: its repository at ``layout.workdir``, the row's base commit
    checked out there, graded by the row's ``eval_script`` when it has one."""
    src = task.workspace
    if isinstance(src, ImageSource):
        workspace = src if src.activate is not None else src.model_copy(update={"activate": layout.activate})
        commit = src.base_commit
    else:
        commit = src.base_commit if isinstance(src, GitSource) and src.base_commit != "HEAD" else None
        workspace = ImageSource(image=image, base_commit=commit, activate=layout.activate)
    metadata = {**task.metadata, "image": image, "image_dataset": dataset, "docker_image": image}
    update: dict[str, Any] = {"workspace": workspace, "metadata": metadata}
    if not isinstance(src, ImageSource):
        update["workdir"] = layout.workdir
    if layout.held_out_tests and task.test_command:
        # as R2E-Gym's runtime: the held-out tests reachable from the repository for the test run only (a
        # directory of that name the diff made is removed first: the tests that run are the image's)
        link = shlex.quote(posixpath.basename(layout.held_out_tests.rstrip("/")))
        update["test_command"] = (f"rm -rf {link} && ln -s {shlex.quote(layout.held_out_tests)} {link} && "
                                  f"{{ {task.test_command}\n}}; rc=$?; rm -f {link}; exit $rc")  # fmt: skip
    script = task.metadata.get("eval_script")
    if isinstance(script, str) and script.strip():
        # SWE-bench's own (activates, applies the test patch, runs, restores), its xtrace and output in one
        # stream as its harness reads them: the markers (stderr) around the tests' output (stdout)
        update["test_command"] = "{\n" + script.rstrip() + "\n} 2>&1"
        metadata["test_command_default"] = False
        metadata["graded_by"] = "eval_script"
    return task.model_copy(update=update)


def _recipe_reading(task: Task, recipe: Any) -> Task:
    """What a recipe says about running and reading its repository's tests, in the image."""
    update: dict[str, Any] = {}
    meta = {**task.metadata}
    if recipe.log_parser and task.metadata.get("log_parser_default"):
        update["log_parser"] = recipe.log_parser
    if recipe.test_command and task.metadata.get("test_command_default"):
        files = task.metadata.get("test_files") or recipe.test_files
        update["test_command"] = fill_test_command(_VENV_ACTIVATION.sub("", recipe.test_command), files)
    if update:
        meta["recipe_reading"] = True
        update["metadata"] = meta
    return task.model_copy(update=update) if update else task
