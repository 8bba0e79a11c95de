"""Load tasks from a file: farm JSONL/JSON/Parquet, SWE-bench, SWE-Gym, SWE-smith, R2E-Gym rows.

``load_tasks(path)`` reads every row, converts it (format per row with ``auto``) and
returns a ``TaskLoadResult``: the good tasks and one ``TaskLoadError`` per problem (naming
file, line or row number, and field; a row with three wrong fields has three, an unknown
key names the closest known one). ``strict=True`` raises them all at once instead
(``TaskFileErrors``), after reading the whole file. ``load_tasks(cfg)`` does the same for a ``TasksConfig`` (``path: demo`` is the
built-in demo set, generated into the cache on first use).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import TaskFileErrors, TaskLoadError
from farm.tasks.config import TasksConfig
from farm.tasks.environment import environment_error
from farm.tasks.formats import CONVERTERS, RowError, detect_format
from farm.tasks.model import Task
from farm.tasks.image_rows import with_environment
from farm.tasks.recipes import RecipeError, load_book

_JSONL = (".jsonl", ".ndjson", ".jsonl.gz")
_CONFIG = object()  # load_tasks' recipes / check_requirements default: the TasksConfig's (or its default)


@dataclass
class TaskLoadResult:
    """The tasks of one file, and what was wrong with the rows that were skipped."""

    path: str
    tasks: list[Task] = field(default_factory=list)
    errors: list[TaskLoadError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def by_id(self) -> dict[str, Task]:
        return {t.id: t for t in self.tasks}

    def __iter__(self) -> Iterator[Task]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any] | TaskLoadError]]:
    """(line/row number, row or the error reading it)."""
    name = str(path)
    suffix = "".join(path.suffixes[-2:]) if path.name.endswith(".gz") else path.suffix
    if suffix in _JSONL:
        opener = _open_text(path)
        with opener as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield lineno, TaskLoadError(name, lineno, "<json>", f"invalid JSON: {exc.msg} (col {exc.colno})")
                    continue
                if not isinstance(row, dict):
                    yield lineno, TaskLoadError(name, lineno, "<row>", "expected a JSON object")
                    continue
                yield lineno, row
    elif suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            yield exc.lineno, TaskLoadError(name, exc.lineno, "<json>", f"invalid JSON: {exc.msg}")
            return
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            yield 1, TaskLoadError(name, 1, "<json>", "expected a list of task objects")
            return
        for i, row in enumerate(data, start=1):
            yield i, row if isinstance(row, dict) else TaskLoadError(name, i, "<row>", "expected an object")
    elif suffix == ".parquet":
        # heavy: pyarrow
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types; reported as a file error
            yield 0, TaskLoadError(name, 0, "<file>", f"unreadable Parquet: {exc}")
            return
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row
    else:
        yield 0, TaskLoadError(name, 0, "<file>", f"unknown task file type {suffix!r} (use .jsonl, .json or .parquet)")


def _open_text(path: Path):  # noqa: ANN202 - a text file object
    if path.name.endswith(".gz"):
        # stdlib gzip, only when used
        import gzip

        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def load_tasks(
    source: str | Path | TasksConfig, *, format: str | None = None, strict: bool | None = None,
    recipes: Any = _CONFIG, check_requirements: Any = _CONFIG, check: Callable[[Task], None] | None = None,
    environments: bool = True, convention_images: bool = False,
) -> TaskLoadResult:
    """Every task in ``source`` (a file, or a ``TasksConfig``: its path — ``demo`` resolved —
    format, strict, recipes and python). Bad rows become ``TaskLoadError``s in the result (with
    ``strict``: raised together, ``TaskFileErrors``, once the whole file is read); so do rows
    whose recipe is missing or needs what this machine lacks, and (``environments``) dataset
    rows whose environment nothing provides (``farm.tasks.environment``; ``convention_images``:
    the sandboxes start from the image a row's format names by convention, as E2B's do);
    duplicate ids are errors on the later row. The result iterates its tasks. ``recipes``
    and ``check_requirements`` default to the config's (``TasksConfig``'s defaults for a file).
    ``check`` (the layers above: e.g. can the grader read the task's ``log_parser``) raises
    ``RowError`` for a task it rejects, reported on the row like any other."""
    cfg = source if isinstance(source, TasksConfig) else TasksConfig()
    if isinstance(source, TasksConfig):
        format = source.format if format is None else format
        strict = source.strict if strict is None else strict
        source = resolve_tasks_path(source)
    book = load_book(cfg.recipes if recipes is _CONFIG else recipes)
    requirements = cfg.check_requirements if check_requirements is _CONFIG else bool(check_requirements)
    format = format or "auto"
    strict = bool(strict)
    p = Path(source).expanduser()
    if not p.is_file():
        err = TaskLoadError(str(p), 0, "<file>", "no such task file")
        if strict:
            raise err
        return TaskLoadResult(path=str(p), errors=[err])
    if format != "auto" and format not in CONVERTERS:
        raise TaskLoadError(str(p), 0, "<format>", f"unknown format {format!r} (one of {sorted(CONVERTERS)})")
    result = TaskLoadResult(path=str(p))
    seen: set[str] = set()
    for lineno, row in _rows(p):
        if isinstance(row, TaskLoadError):
            errs = [row]
        else:
            fmt = detect_format(row) if format == "auto" else format
            try:
                task = CONVERTERS[fmt](row)
                task = with_environment(task, row, fmt, images=cfg.images, book=book, check_requirements=requirements)
                missing = environment_error(task, python=cfg.python, convention_images=convention_images)
                if environments and missing:
                    raise RowError("environment", missing)
                if check is not None:
                    check(task)
            except RowError as exc:
                errs = [TaskLoadError(str(p), lineno, field, f"{msg} ({fmt} row)") for field, msg in exc.problems]
            except RecipeError as exc:
                errs = [TaskLoadError(str(p), lineno, exc.field, exc.message)]
            else:
                if task.id in seen:
                    errs = [TaskLoadError(str(p), lineno, "id", f"duplicate task id {task.id!r}")]
                else:
                    seen.add(task.id)
                    result.tasks.append(task)
                    continue
        result.errors.extend(errs)
    if strict and result.errors:
        raise TaskFileErrors(result.errors)
    return result


def resolve_tasks_path(cfg: TasksConfig) -> Path:
    """The task file a config names; ``demo`` generates the demo set (once) and returns its JSONL."""
    if cfg.path == "demo":
        # the demo task set is built only when asked for
        from farm.tasks.demo import ensure_demo_set

        return ensure_demo_set(cfg.cache_dir).tasks_path
    return Path(cfg.path).expanduser()


