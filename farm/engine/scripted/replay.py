"""Moved to ``farm.simulator.replay`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.replay import *  # noqa: F403

warnings.warn("farm.engine.scripted.replay moved to farm.simulator.replay", DeprecationWarning, stacklevel=2)
