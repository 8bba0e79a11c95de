"""Moved to ``farm.output.torch_data`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.torch_data import *  # noqa: F403

warnings.warn("farm.trajectory.torch_data moved to farm.output.torch_data", DeprecationWarning, stacklevel=2)
