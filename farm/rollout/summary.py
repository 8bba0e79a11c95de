"""Moved to ``farm.run.summary`` (issue 29: the run's modules live in ``farm/run/``); this
name keeps working for one release."""

import warnings

from farm.run.summary import *  # noqa: F403

warnings.warn("farm.rollout.summary moved to farm.run.summary", DeprecationWarning, stacklevel=2)
