"""Moved to ``farm.output.groups`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.groups import *  # noqa: F403

warnings.warn("farm.rollout.group_reader moved to farm.output.groups", DeprecationWarning, stacklevel=2)
