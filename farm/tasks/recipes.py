"""Recipes: how a local sandbox sets up rows whose environment is a container image.

SWE-bench-family rows bring no setup commands: their environment is a docker image
(SWE-bench builds it from its per-repository, per-version specs). A recipe supplies the
same for a local sandbox, in the shape of SWE-bench's harness specs (repository ->
version -> spec)::

    astropy/astropy:
      "5.1":
        python: "3.9"                 # a version found on this machine (pyenv, PATH) or a path
        requires:                     # what only apt / conda / a download provides (farm.tasks.requirements)
          - {apt: build-essential, check: "command:gcc"}
        base_setup:                   # the heavy, instance-independent part: the venv and its packages
          - uv venv -q --seed .venv
          - farm-requirements requirements-dev.txt   # a step of farm's (farm.tasks.venvs), as SWE-bench reads the file
          - uv pip install -q --python .venv/bin/python numpy==1.25.2 pytest==7.4.0
        setup:                        # per instance, on top: the checkout's own install
          - echo .venv/ >> .git/info/exclude
          - uv pip install -q --python .venv/bin/python -e .[test]
        env: {PYTHONWARNINGS: ignore} # for setup, tests and verify commands
        test_command: . .venv/bin/activate && pytest -rA {test_files}
        test_files: [astropy/tests]   # when the row's test patch / ids name none
        log_parser: parse_log_astropy
      "*": {...}                      # any other version of the repository

farm ships a **recipe book** (``farm/tasks/recipe_book/``: every repository and version of
SWE-bench's harness specs); ``tasks.recipes`` says which recipes apply (``recipe_sources``)
and a user's file overrides the book per repository-version. A row's own values win (its
setup commands, env, test command, log parser); a recipe only fills what the row leaves
out. ``{test_files}`` is the test files the row's test patch touches (or its test ids
name), else the recipe's ``test_files``; ``{test_labels}`` is the same as Django's
``runtests.py`` labels (``tests/a/b.py`` -> ``a.b``). farm's own steps in the commands
(``farm-requirements``, ``farm-conda-env``) become the commands that carry them out, and
the venv the commands make is made a self-contained prefix (``farm.tasks.venvs``).
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from farm.errors import TaskError, TaskLoadError
from farm.tasks.model import GitSource, Task, TaskTimeouts
from farm.tasks.requirements import Requirement, unmet
from farm.tasks.venvs import expand, prefix_step, step_error

BUILTIN = "builtin"
BOOK_DIR = "recipe_book"  # inside the farm.tasks package
_PYTHON = re.compile(r"^\d+\.\d+(\.\d+)?$")
# SWE-bench's NON_TEST_EXTS: files a test patch touches that are data, not tests to run.
NON_TEST_EXTS = (".json", ".png", ".csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml")


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str | None = Field(default=None, description="a version ('3.9') found on this machine, or an absolute path")
    requires: list[Requirement] = Field(default_factory=list)
    base_setup: list[str] = Field(default_factory=list, description="fills Task.base_setup_commands")
    setup: list[str] = Field(default_factory=list, description="fills Task.setup_commands")
    env: dict[str, str] = Field(default_factory=dict)
    timeouts: TaskTimeouts | None = Field(
        default=None, description="budgets for a row that leaves its own at the defaults (a long C extension build)"
    )
    test_command: str | None = Field(default=None, description="may use {test_files} / {test_labels}")
    test_files: list[str] = Field(default_factory=list)
    log_parser: str | None = None

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None and not (_PYTHON.match(value) or value.startswith("/")):
            raise ValueError(f"expected a version like '3.9' or an absolute path, got {value!r}")
        return value

    @field_validator("base_setup", "setup")
    @classmethod
    def _commands(cls, value: list[str]) -> list[str]:
        if any(not c.strip() for c in value):
            raise ValueError("an empty command")
        for command in value:  # farm's own steps (farm.tasks.venvs): farm-requirements, farm-conda-env
            if (problem := step_error(command)) is not None:
                raise ValueError(problem)
        return value

    @field_validator("test_command", "log_parser")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("empty")
        return value


class RecipeError(Exception):
    """A row the recipes cannot set up: which field, what is missing."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


@dataclass(frozen=True)
class RecipeMatch:
    repo: str
    key: str  # the version key that matched ("*" for a repository's catch-all)
    recipe: Recipe
    origin: str  # "builtin" or the recipe file

    @property
    def name(self) -> str:
        return f"{self.repo}@{self.key}"


RecipeFile = dict[str, dict[str, Recipe]]


@dataclass
class RecipeBook:
    """Recipe sources in order of precedence (last wins): for a repository, the last source
    that has the row's version, or failing that a ``"*"``, gives its recipe."""

    layers: list[tuple[str, RecipeFile]] = field(default_factory=list)
    _unmet: dict[tuple[str, str, str, bool], list[tuple[str, bool]]] = field(default_factory=dict, repr=False)

    def __bool__(self) -> bool:
        return any(recipes for _, recipes in self.layers)

    def lookup(self, repo: str, version: str) -> RecipeMatch | None:
        for origin, recipes in reversed(self.layers):
            versions = recipes.get(repo) or {}
            for key in (version, "*"):
                if key in versions:
                    return RecipeMatch(repo, key, versions[key], origin)
        return None

    def versions(self, repo: str) -> list[str]:
        """Every version some source has a recipe for (natural order)."""
        found = {v for _, recipes in self.layers for v in recipes.get(repo, {})}
        return sorted(found, key=_version_key)

    def unmet(self, match: RecipeMatch, *, check_python: bool) -> list[tuple[str, bool]]:
        """What ``match``'s recipe needs and this machine lacks (described, and whether installing
        it here would do), checked once per recipe."""
        key = (match.origin, match.repo, match.key, check_python)
        if key not in self._unmet:
            self._unmet[key] = _unmet(match.recipe, check_python)
        return self._unmet[key]


def _version_key(version: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"[.]", version.lstrip("v"))]


def _unmet(recipe: Recipe, check_python: bool) -> list[tuple[str, bool]]:
    """(what is missing, whether installing something on this machine would fix it)."""
    out: list[tuple[str, bool]] = []
    if check_python and recipe.python and _PYTHON.match(recipe.python):
        # heavy: farm.tasks.runtime loads the environment builders
        from farm.tasks.runtime import find_python

        try:
            find_python(recipe.python)
        except TaskError as exc:
            out.append((f"python {recipe.python}: {exc}", True))
    return out + unmet(recipe.requires)


# --- loading --------------------------------------------------------------------------------
def _parse(raw: Any, where: str) -> RecipeFile:
    if not isinstance(raw, dict):
        raise TaskLoadError(where, 0, "<recipes>", "expected a mapping repository -> version -> recipe")
    book: RecipeFile = {}
    for repo, versions in raw.items():
        if not isinstance(versions, dict):
            raise TaskLoadError(where, 0, str(repo), "expected a mapping version -> recipe")
        for version, spec in versions.items():
            if isinstance(version, float):  # YAML reads 0.20 as the number 0.2: never what was meant
                msg = f"a version must be a string: quote it ('{version}')"
                raise TaskLoadError(where, 0, f"{repo}.{version}", msg)
            try:
                book.setdefault(str(repo), {})[str(version)] = Recipe.model_validate(spec or {})
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(x) for x in err["loc"])
                raise TaskLoadError(where, 0, f"{repo}.{version}.{loc}", err["msg"]) from None
    return book


def load_recipes(path: str | Path) -> RecipeFile:
    """One recipe file (YAML: repository -> version -> recipe)."""
    p = Path(path).expanduser()
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise TaskLoadError(str(p), 0, "<recipes>", f"unreadable recipe file: {exc}") from None
    return _parse(raw, str(p))


@functools.lru_cache(maxsize=1)
def builtin_recipes() -> RecipeFile:
    """farm's recipe book (one YAML file per repository, shipped in the package)."""
    book: RecipeFile = {}
    for entry in sorted(resources.files("farm.tasks").joinpath(BOOK_DIR).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".yaml"):
            continue
        where = f"{BUILTIN}:{entry.name}"
        try:
            raw = yaml.load(entry.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        except yaml.YAMLError as exc:
            raise TaskLoadError(where, 0, "<recipes>", f"unreadable recipe book file: {exc}") from None
        for repo, versions in _parse(raw, where).items():
            if repo in book:
                raise TaskLoadError(where, 0, repo, "repository already in another file of the book")
            book[repo] = versions
    return book


def recipe_sources(value: str | Path | Sequence[str] | None) -> list[str]:
    """``tasks.recipes`` as the sources it names, lowest precedence first: ``builtin`` (the
    default) = farm's book; a file = the book, then the file over it; a list = exactly those
    sources in that order (``builtin`` among them or not); ``none`` / null = no recipes."""
    if value is None or value == "none":
        return []
    if isinstance(value, (str, Path)):
        return [BUILTIN] if str(value) == BUILTIN else [BUILTIN, str(value)]
    return [str(v) for v in value]


def load_book(value: str | Path | Sequence[str] | None) -> RecipeBook:
    layers = []
    for source in recipe_sources(value):
        recipes = builtin_recipes() if source == BUILTIN else load_recipes(source)
        layers.append((source, recipes))
    return RecipeBook(layers)


# --- applying -------------------------------------------------------------------------------
def test_files_for(files: Sequence[str]) -> list[str]:
    """The files to hand a test runner: data files of the test patch left out (as SWE-bench does)."""
    return [f for f in files if not f.endswith(NON_TEST_EXTS)]


def django_labels(files: Sequence[str]) -> list[str]:
    """Django's runtests.py labels for test files, as SWE-bench derives them:
    ``tests/a/b.py`` -> ``a.b``."""
    out = []
    for f in files:
        f = f[: -len(".py")] if f.endswith(".py") else f
        f = f[len("tests/") :] if f.startswith("tests/") else f
        out.append(f.replace("/", "."))
    return out


def fill_test_command(command: str, files: Sequence[str]) -> str:
    tests = test_files_for(files)
    return command.replace("{test_files}", " ".join(shlex.quote(f) for f in tests)).replace(
        "{test_labels}", " ".join(shlex.quote(label) for label in django_labels(tests))
    )


def _makes_venv(commands: Sequence[str]) -> bool:
    return any(".venv" in c and " venv" in c for c in commands)


def apply_recipe(task: Task, book: RecipeBook, *, check_requirements: bool = True) -> Task:
    """``task`` with what its recipe supplies (unchanged when the book has none for its
    repository). ``RecipeError`` when the book knows the repository but not the row's
    version (and the row brings no setup of its own), or when the recipe needs what this
    machine lacks (``check_requirements``)."""
    src = task.workspace
    repo = src.repo if isinstance(src, GitSource) else None
    if not repo or not book:
        return task
    version = str(task.metadata.get("version") or "")
    match = book.lookup(repo, version)
    if match is None:
        known = book.versions(repo)
        if known and not (task.setup_commands or task.base_setup_commands):
            what = f"version {version!r}" if version else "no version"
            raise RecipeError(
                "version", f"no recipe for {repo} {what}: recipes exist for versions {', '.join(known)}; "
                "give the row one of those or add this version to your recipe file (tasks.recipes)",
            )  # fmt: skip
        return task
    recipe = match.recipe
    update: dict[str, Any] = {
        "metadata": {**task.metadata, "recipe": f"{repo}@{version or match.key}", "recipe_source": match.origin}
    }
    # farm's steps in the recipe's commands carried out; the venv they make (in the workdir's
    # .venv, as the book's do) made a prefix after the commands that make and fill it
    venv_in = "base_setup" if _makes_venv(recipe.base_setup) else "setup" if _makes_venv(recipe.setup) else None
    if not task.base_setup_commands and recipe.base_setup:
        update["base_setup_commands"] = [*map(expand, recipe.base_setup), *([prefix_step()] if venv_in == "base_setup" else [])]
    if not task.setup_commands and recipe.setup:
        update["setup_commands"] = [*map(expand, recipe.setup), *([prefix_step()] if venv_in == "setup" else [])]
    if task.python is None and recipe.python:
        update["python"] = recipe.python
    if check_requirements and len(update) > 1:  # the recipe's environment is used: it must be buildable here
        unmet = book.unmet(match, check_python="python" in update)
        if unmet:
            fix = "install it, or override" if any(fixable for _, fixable in unmet) else "override"
            raise RecipeError(
                "recipe", f"recipe {match.name} ({match.origin}) needs what this machine lacks: "
                f"{'; '.join(what for what, _ in unmet)}; {fix} {match.name} in your recipe file (tasks.recipes)",
            )  # fmt: skip
    if recipe.env:
        update["env"] = {**recipe.env, **task.env}
    if recipe.timeouts is not None and task.timeouts == TaskTimeouts():
        update["timeouts"] = recipe.timeouts
    if recipe.test_command and task.metadata.get("test_command_default"):
        files = task.metadata.get("test_files") or recipe.test_files
        update["test_command"] = fill_test_command(recipe.test_command, files)
    if recipe.log_parser and task.metadata.get("log_parser_default"):
        update["log_parser"] = recipe.log_parser  # as SWE-bench names it: the grader reads every such name
    return task.model_copy(update=update)
