"""Moved to ``farm.simulator.server`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.server import *  # noqa: F403

warnings.warn("farm.engine.scripted.server moved to farm.simulator.server", DeprecationWarning, stacklevel=2)
