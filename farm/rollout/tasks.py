"""Moved to ``farm.run.tasks`` (issue 29: the run's modules live in ``farm/run/``); this
name keeps working for one release."""

import warnings

from farm.run.tasks import *  # noqa: F403

warnings.warn("farm.rollout.tasks moved to farm.run.tasks", DeprecationWarning, stacklevel=2)
