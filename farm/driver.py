"""Moved to ``farm.run.batch`` (issue 29: the run session, ``farm/run/``, starts every
run); ``farm.driver.run_farm`` keeps working for one release.

(The private helper below serves ``farm.single`` until it opens a run session too.)"""

from __future__ import annotations

import warnings
from pathlib import Path

from farm.config import FarmConfig
from farm.run.batch import run_batch
from farm.run.batch import run_batch as run_farm

__all__ = ["run_batch", "run_farm"]

warnings.warn("farm.driver moved to farm.run.batch (run_farm is run_batch)", DeprecationWarning, stacklevel=2)


def _write_run_config(cfg: FarmConfig, out_dir: Path) -> None:
    """The resolved config next to the shards, once its task set is the one the directory
    holds (``farm.rollout.outdir``: another one is refused). Also farm.Farm's and farm.Rollouts'."""
    from farm.rollout.outdir import check_tasks_source, write_run_config

    check_tasks_source(cfg, out_dir)
    write_run_config(cfg, out_dir)
