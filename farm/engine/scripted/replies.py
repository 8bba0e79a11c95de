"""Moved to ``farm.simulator.replies`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.replies import *  # noqa: F403

warnings.warn("farm.engine.scripted.replies moved to farm.simulator.replies", DeprecationWarning, stacklevel=2)
