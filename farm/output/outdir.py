"""What an output directory says about the runs that wrote it: their config
(``run_config.yaml``), and the rule that one directory holds one task set.

Rollout ids are ``<task id>.<i>``: a run resuming in a directory that holds another task
file's rollouts would take them for its own (done, skipped) and mix two task sets' groups.
So before a run, a ``farm rollout`` or a ``farm serve`` writes its ``run_config.yaml``,
the task file it names is compared with the one of the run before it there (when that
run recorded anything): a different one is refused (a ``ConfigError`` naming both and the
way out), or, with ``output.mixed_tasks: allow``, a warning. ``demo`` is the built-in set;
a file is compared by its resolved path (``run_config.yaml`` records it resolved).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import yaml

from farm.errors import ConfigError
from farm.output.manifest import default_manifest_name

RUN_CONFIG = "run_config.yaml"
log = logging.getLogger(__name__)


def tasks_source(path: str) -> str:
    """``tasks.path`` as compared: ``demo``, or the file's resolved path."""
    return path if path == "demo" else str(Path(path).expanduser().resolve())


def earlier_tasks_source(out_dir: Path) -> str | None:
    """The task file of the run that wrote ``out_dir`` last, when it recorded rollouts."""
    manifest = out_dir / default_manifest_name("rollouts")
    cfg_path = out_dir / RUN_CONFIG
    try:
        if manifest.stat().st_size == 0:
            return None
        cfg = yaml.safe_load(cfg_path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    path = (cfg.get("tasks") or {}).get("path") if isinstance(cfg, dict) else None
    return tasks_source(str(path)) if path else None


def check_tasks_source(cfg: Any, out_dir: Path) -> str | None:
    """Refuse (``ConfigError``) a task file other than the one ``out_dir``'s rollouts came
    from; with ``output.mixed_tasks: allow`` return the warning instead (None: same set,
    or nothing recorded yet)."""
    before = earlier_tasks_source(out_dir)
    now = tasks_source(cfg.tasks.path)
    if before is None or before == now:
        return None
    what = (f"{out_dir} holds rollouts of tasks.path={before} ({RUN_CONFIG}); this run's tasks.path is {now}: "
            f"rollout ids are <task id>.<i>, so a resume would take the other set's rollouts for done and groups "
            f"would mix")  # fmt: skip
    if cfg.output.mixed_tasks != "allow":
        raise ConfigError(f"{what}. Use another output.dir, or --set output.mixed_tasks=allow to add to it anyway")
    log.warning("%s (output.mixed_tasks: allow)", what)
    return what


def write_run_config(cfg: Any, out_dir: Path) -> Path:
    """The resolved config next to the shards (``farm inspect`` and the report read the
    tokenizer and the task file from it), written atomically, ``tasks.path`` resolved."""
    data = cfg.model_dump(mode="json")
    data["tasks"]["path"] = tasks_source(cfg.tasks.path)
    path = out_dir / RUN_CONFIG
    tmp = out_dir / f".{RUN_CONFIG}.tmp"
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)
    return path
