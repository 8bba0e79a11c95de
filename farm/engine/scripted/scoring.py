"""Moved to ``farm.simulator.scoring`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.scoring import *  # noqa: F403

warnings.warn("farm.engine.scripted.scoring moved to farm.simulator.scoring", DeprecationWarning, stacklevel=2)
