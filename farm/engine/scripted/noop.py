"""Moved to ``farm.simulator.noop`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.noop import *  # noqa: F403

warnings.warn("farm.engine.scripted.noop moved to farm.simulator.noop", DeprecationWarning, stacklevel=2)
