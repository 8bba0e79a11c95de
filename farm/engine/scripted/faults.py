"""Moved to ``farm.simulator.faults`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.faults import *  # noqa: F403

warnings.warn("farm.engine.scripted.faults moved to farm.simulator.faults", DeprecationWarning, stacklevel=2)
