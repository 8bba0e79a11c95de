"""Moved to ``farm.run.stream`` (issue 29: the run's modules live in ``farm/run/``); this
name keeps working for one release."""

import warnings

from farm.run.stream import *  # noqa: F403

warnings.warn("farm.rollout.stream moved to farm.run.stream", DeprecationWarning, stacklevel=2)
