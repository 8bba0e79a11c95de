"""Moved to ``farm.simulator.oracle`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.oracle import *  # noqa: F403

warnings.warn("farm.engine.scripted.oracle moved to farm.simulator.oracle", DeprecationWarning, stacklevel=2)
