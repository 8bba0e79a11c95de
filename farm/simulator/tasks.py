"""The oracle's task set: farm Tasks from JSONL, recognised by their instruction text."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable

from pydantic import ValidationError

from farm.errors import TaskLoadError
from farm.tasks.model import Task

_WS = re.compile(r"\s+")


def load_tasks_jsonl(path: str | os.PathLike[str]) -> list[Task]:
    """One ``Task`` per non-empty line; a bad line raises ``TaskLoadError`` (file, line, field)."""
    tasks: list[Task] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.model_validate_json(line))
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(p) for p in err.get("loc", ())) or "<line>"
                raise TaskLoadError(str(path), lineno, field, err.get("msg", str(exc))) from exc
    return tasks


def write_tasks_jsonl(tasks: Iterable[Task], path: str | os.PathLike[str]) -> Path:
    """Write tasks for a worker subprocess (atomic rename)."""
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for task in tasks:
            fh.write(task.model_dump_json() + "\n")
    os.replace(tmp, out)
    return out


def normalize(text: str) -> str:
    """Whitespace-insensitive form used for matching (CLIs re-wrap and escape text)."""
    return _WS.sub(" ", text).strip()


class TaskIndex:
    """Finds the task whose instruction appears in a prompt (longest match wins)."""

    def __init__(self, tasks: Iterable[Task]) -> None:
        self._tasks = sorted(
            ((normalize(t.instruction), t) for t in tasks), key=lambda p: len(p[0]), reverse=True
        )

    def __len__(self) -> int:
        return len(self._tasks)

    def find(self, text: str) -> Task | None:
        norm = normalize(text)
        escaped = None
        for instr, task in self._tasks:
            if instr and instr in norm:
                return task
            # Some CLIs send the instruction JSON-escaped inside a larger string.
            if escaped is None:
                escaped = norm.replace('\\"', '"').replace("\\n", " ")
                escaped = normalize(escaped)
            if instr and instr in escaped:
                return task
        return None
