"""Moved to ``farm.simulator.state`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.state import *  # noqa: F403

warnings.warn("farm.engine.scripted.state moved to farm.simulator.state", DeprecationWarning, stacklevel=2)
