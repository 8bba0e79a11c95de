"""Moved to ``farm.run.lock`` (issue 29: the run's modules live in ``farm/run/``); this
name keeps working for one release."""

import warnings

from farm.run.lock import *  # noqa: F403

warnings.warn("farm.rollout.runlock moved to farm.run.lock", DeprecationWarning, stacklevel=2)
