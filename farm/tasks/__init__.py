"""Tasks as data: the task model, row formats and loaders, recipes, the repository cache,
the interpreter a task runs with. Nothing here drives a sandbox (that is ``farm.workspace``).

Public API: ``Task`` (model), ``load_tasks`` (loaders), ``TaskRuntime`` (runtime),
``load_book`` / ``apply_recipe`` (recipes: farm's recipe book in ``recipe_book/`` and the
user's files), ``ensure_demo_set`` (demo).
"""

from farm.tasks.model import GitSource, ImageSource, Task, TarballSource, TaskTimeouts, WorkspaceSource

__all__ = ["GitSource", "ImageSource", "Task", "TarballSource", "TaskTimeouts", "WorkspaceSource"]
