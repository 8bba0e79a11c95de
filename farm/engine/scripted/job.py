"""Moved to ``farm.simulator.job`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.job import *  # noqa: F403

warnings.warn("farm.engine.scripted.job moved to farm.simulator.job", DeprecationWarning, stacklevel=2)
