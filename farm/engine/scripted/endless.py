"""Moved to ``farm.simulator.endless`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.endless import *  # noqa: F403

warnings.warn("farm.engine.scripted.endless moved to farm.simulator.endless", DeprecationWarning, stacklevel=2)
