"""Moved to ``farm.simulator.weights`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.weights import *  # noqa: F403

warnings.warn("farm.engine.scripted.weights moved to farm.simulator.weights", DeprecationWarning, stacklevel=2)
