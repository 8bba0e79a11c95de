"""A task family where the model's own choice decides the reward (for learning tests).

:func:`choice_tasks` turns tasks with a gold patch (the demo SWE tasks) into tasks whose
``metadata["candidate_patches"]`` holds ``k`` candidate fixes for the ``choose`` policy
(``farm.engine.scripted.choose``): the gold patch at index ``i % k`` for the ``i``-th
task (so the right letter differs between tasks and a model must tell the tasks apart),
and ``k - 1`` decoys that apply cleanly and fix nothing (each adds a note file). The
instruction names the candidates. Grading is the task's own: only the gold candidate
makes its FAIL_TO_PASS tests pass.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from farm.engine.scripted.choose import CANDIDATES_KEY, LABELS
from farm.engine.scripted.tasks import write_tasks_jsonl
from farm.tasks.model import Task


def decoy_patch(task_id: str, label: str) -> str:
    """A patch that applies to any tree and changes no behaviour: a new note file."""
    path = f"notes/candidate-{label}.md"
    line = f"Candidate fix {label} for {task_id}: tried, not applicable."
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1 @@\n+{line}\n")


def choice_tasks(tasks: Iterable[Task], k: int = 4) -> list[Task]:
    """Each task with a gold patch, with ``k`` candidate patches; the others are dropped."""
    if not 2 <= k <= len(LABELS):
        raise ValueError(f"k must be in [2, {len(LABELS)}]")
    out = []
    for task in (t for t in tasks if t.gold_patch):
        right = len(out) % k
        patches = [task.gold_patch if j == right else decoy_patch(task.id, LABELS[j]) for j in range(k)]
        labels = ", ".join(f"[{LABELS[j]}]" for j in range(k))
        instruction = (f"{task.instruction.rstrip()}\n\nThere are {k} candidate fixes, {labels}; exactly one "
                       "resolves the issue. Apply one of them.\n")
        metadata = {**task.metadata, CANDIDATES_KEY: patches, "right_candidate": LABELS[right]}
        out.append(task.model_copy(update={"instruction": instruction, "metadata": metadata}))
    return out


def write_choice_tasks(tasks: Iterable[Task], path: str | Path, k: int = 4) -> Path:
    """:func:`choice_tasks` written as a farm tasks JSONL (``tasks.path``)."""
    return write_tasks_jsonl(choice_tasks(tasks, k), path)
