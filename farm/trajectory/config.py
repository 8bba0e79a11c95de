"""Moved to ``farm.output.config`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.config import *  # noqa: F403

warnings.warn("farm.trajectory.config moved to farm.output.config", DeprecationWarning, stacklevel=2)
