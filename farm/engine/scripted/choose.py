"""Moved to ``farm.simulator.choose`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.choose import *  # noqa: F403

warnings.warn("farm.engine.scripted.choose moved to farm.simulator.choose", DeprecationWarning, stacklevel=2)
