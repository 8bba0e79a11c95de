"""Moved to ``farm.output.reader`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.reader import *  # noqa: F403

warnings.warn("farm.trajectory.output moved to farm.output.reader", DeprecationWarning, stacklevel=2)
