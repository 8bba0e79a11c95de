"""Moved to ``farm.run.progress`` (issue 29: the run's modules live in ``farm/run/``); this
name keeps working for one release."""

import warnings

from farm.run.progress import *  # noqa: F403

warnings.warn("farm.rollout.progress moved to farm.run.progress", DeprecationWarning, stacklevel=2)
