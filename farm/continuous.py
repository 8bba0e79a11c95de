"""Moved to ``farm.run.continuous`` (issue 29: the run session, ``farm/run/``, starts every
run); ``farm.continuous.Farm`` keeps working for one release (``farm.Farm`` is the name to use)."""

import warnings

from farm.run.continuous import Farm, FarmStopped

__all__ = ["Farm", "FarmStopped"]

warnings.warn("farm.continuous moved to farm.run.continuous", DeprecationWarning, stacklevel=2)
