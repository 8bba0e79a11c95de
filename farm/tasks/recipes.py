"""Recipes: what a local sandbox needs to set up rows that name a container image.

SWE-bench-family rows bring no setup commands: their environment is a docker image
(SWE-bench builds it from its per-repository, per-version specs). For the local backend
a recipe file supplies the same, in the shape SWE-bench's harness uses
(repository -> version -> spec)::

    astropy/astropy:
      "5.1":
        python: "3.9"                       # a version found on this machine (pyenv, PATH) or a path
        setup:                              # run once per environment (farm.envs), in the workdir
          - uv venv -q .venv
          - uv pip install -q --python .venv/bin/python -e .[test]
        env: {PYTHONWARNINGS: ignore}       # for setup, tests and verify commands
        test_command: .venv/bin/python -m pytest -rA {test_files}
        test_files: [astropy/tests]         # when the row's test patch / ids name none
        log_parser: pytest
      "*": {...}                            # any other version of the repository

A row's own values win (its setup commands, env, test command); a recipe only fills what
the row leaves out. ``{test_files}`` is the files the row's test patch touches (or its
test ids name), else the recipe's ``test_files``.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.errors import TaskLoadError
from farm.tasks.model import GitSource, Task


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str | None = None
    setup: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    test_command: str | None = Field(default=None, description="may use {test_files}")
    test_files: list[str] = Field(default_factory=list)
    log_parser: str | None = None


RecipeBook = dict[str, dict[str, Recipe]]


def load_recipes(path: str | Path) -> RecipeBook:
    p = Path(path).expanduser()
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise TaskLoadError(str(p), 0, "<recipes>", f"unreadable recipe file: {exc}") from None
    if not isinstance(raw, dict):
        raise TaskLoadError(str(p), 0, "<recipes>", "expected a mapping repository -> version -> recipe")
    book: RecipeBook = {}
    for repo, versions in raw.items():
        if not isinstance(versions, dict):
            raise TaskLoadError(str(p), 0, str(repo), "expected a mapping version -> recipe")
        for version, spec in versions.items():
            try:
                book.setdefault(str(repo), {})[str(version)] = Recipe.model_validate(spec or {})
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(x) for x in err["loc"])
                raise TaskLoadError(str(p), 0, f"{repo}.{version}.{loc}", err["msg"]) from None
    return book


def recipe_for(task: Task, book: RecipeBook) -> Recipe | None:
    src = task.workspace
    repo = src.repo if isinstance(src, GitSource) else None
    versions = book.get(repo or "", {})
    version = str(task.metadata.get("version", ""))
    return versions.get(version) or versions.get("*")


def apply_recipe(task: Task, book: RecipeBook) -> Task:
    """``task`` with what its recipe supplies (unchanged when none matches)."""
    recipe = recipe_for(task, book)
    if recipe is None:
        return task
    update: dict = {"metadata": {**task.metadata, "recipe": f"{getattr(task.workspace, 'repo', '')}@"
                                 f"{task.metadata.get('version', '*')}"}}  # fmt: skip
    if not task.setup_commands:
        update["setup_commands"] = list(recipe.setup)
    if task.python is None and recipe.python:
        update["python"] = recipe.python
    if recipe.env:
        update["env"] = {**recipe.env, **task.env}
    if recipe.test_command and task.metadata.get("test_command_default"):
        files = task.metadata.get("test_files") or recipe.test_files
        update["test_command"] = recipe.test_command.replace("{test_files}", " ".join(shlex.quote(f) for f in files))
    if recipe.log_parser:
        update["log_parser"] = recipe.log_parser
    return task.model_copy(update=update)
