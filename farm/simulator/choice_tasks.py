"""A task family where the model's own choice decides the reward (for learning tests).

:func:`choice_tasks` turns tasks with a gold patch (the demo SWE tasks) into tasks whose
``metadata["candidate_patches"]`` holds ``k`` candidate fixes for the ``choose`` policy
(``farm.simulator.choose``): the gold patch and ``k - 1`` decoys that apply
cleanly and fix nothing (each adds a note file). The gold patch is candidate ``right``
in every task (a policy learns where the right fix is from rewards alone), or with
``right=None`` candidate ``i % k`` of the ``i``-th task (a policy must also tell the
tasks apart: harder, more than a few dozen steps for farm's tiny CPU model). The
instruction names the candidates. Grading is the task's own: only the gold candidate
makes its FAIL_TO_PASS tests pass. ``metadata["right_candidate"]`` is for reports; the
policy never reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from farm.simulator.choose import CANDIDATES_KEY, LABELS
from farm.simulator.tasks import write_tasks_jsonl
from farm.tasks.model import Task


def decoy_patch(task_id: str, index: int) -> str:
    """A patch that applies to any tree and changes no behaviour: a new note file."""
    path = f"notes/candidate-{index + 1}.md"
    line = f"Candidate fix {index + 1} for {task_id}: tried, not applicable."
    return (f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
            f"@@ -0,0 +1 @@\n+{line}\n")


def choice_tasks(tasks: Iterable[Task], k: int = 4, right: int | None = -1) -> list[Task]:
    """Each task with a gold patch, with ``k`` candidate patches; the others are dropped.
    The gold patch is candidate ``right`` of every task (-1: the last), or (None) of the
    ``i``-th task ``i % k``."""
    if not 2 <= k <= len(LABELS):
        raise ValueError(f"k must be in [2, {len(LABELS)}]")
    if right is not None and not -k <= right < k:
        raise ValueError(f"right must be a candidate index in [-{k}, {k})")
    out = []
    for task in (t for t in tasks if t.gold_patch):
        gold = len(out) % k if right is None else right % k
        patches = [task.gold_patch if j == gold else decoy_patch(task.id, j) for j in range(k)]
        labels = ", ".join(f"[{LABELS[j]}]" for j in range(k))
        instruction = (f"{task.instruction.rstrip()}\n\nThere are {k} candidate fixes, {labels}; exactly one "
                       "resolves the issue. Apply one of them.\n")
        metadata = {**task.metadata, CANDIDATES_KEY: patches, "right_candidate": LABELS[gold]}
        out.append(task.model_copy(update={"instruction": instruction, "metadata": metadata}))
    return out


def write_choice_tasks(tasks: Iterable[Task], path: str | Path, k: int = 4, right: int | None = -1) -> Path:
    """:func:`choice_tasks` written as a farm tasks JSONL (``tasks.path``)."""
    return write_tasks_jsonl(choice_tasks(tasks, k, right), path)
