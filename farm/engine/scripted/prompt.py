"""Moved to ``farm.simulator.prompt`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.prompt import *  # noqa: F403

warnings.warn("farm.engine.scripted.prompt moved to farm.simulator.prompt", DeprecationWarning, stacklevel=2)
