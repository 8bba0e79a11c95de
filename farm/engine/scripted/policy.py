"""Moved to ``farm.simulator.policy`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.policy import *  # noqa: F403

warnings.warn("farm.engine.scripted.policy moved to farm.simulator.policy", DeprecationWarning, stacklevel=2)
