"""Moved to ``farm.simulator.generation`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.generation import *  # noqa: F403

warnings.warn("farm.engine.scripted.generation moved to farm.simulator.generation", DeprecationWarning, stacklevel=2)
