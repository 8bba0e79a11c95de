"""Moved to ``farm.output.rows`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.rows import *  # noqa: F403

warnings.warn("farm.rollout.table moved to farm.output.rows", DeprecationWarning, stacklevel=2)
