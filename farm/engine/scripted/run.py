"""Moved to ``farm.simulator.run`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.run import *  # noqa: F403

warnings.warn("farm.engine.scripted.run moved to farm.simulator.run", DeprecationWarning, stacklevel=2)
