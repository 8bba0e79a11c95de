"""Moved to ``farm.simulator.protocol`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.protocol import *  # noqa: F403

warnings.warn("farm.engine.scripted.protocol moved to farm.simulator.protocol", DeprecationWarning, stacklevel=2)
