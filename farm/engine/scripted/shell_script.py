"""Moved to ``farm.simulator.shell_script`` (issue 29); this name keeps working for one release."""

import warnings

from farm.simulator.shell_script import *  # noqa: F403

warnings.warn("farm.engine.scripted.shell_script moved to farm.simulator.shell_script", DeprecationWarning, stacklevel=2)
