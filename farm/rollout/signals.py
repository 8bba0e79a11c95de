"""Moved to ``farm.run.signals`` (issue 29: the run's modules live in ``farm/run/``); this
name keeps working for one release."""

import warnings

from farm.run.signals import *  # noqa: F403

warnings.warn("farm.rollout.signals moved to farm.run.signals", DeprecationWarning, stacklevel=2)
