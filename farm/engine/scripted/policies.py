"""Moved to ``farm.simulator.policies`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.policies import *  # noqa: F403

warnings.warn("farm.engine.scripted.policies moved to farm.simulator.policies", DeprecationWarning, stacklevel=2)
