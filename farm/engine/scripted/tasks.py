"""Moved to ``farm.simulator.tasks`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.tasks import *  # noqa: F403

warnings.warn("farm.engine.scripted.tasks moved to farm.simulator.tasks", DeprecationWarning, stacklevel=2)
