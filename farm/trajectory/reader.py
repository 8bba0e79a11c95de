"""Moved to ``farm.output.shard_reader`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.shard_reader import *  # noqa: F403

warnings.warn("farm.trajectory.reader moved to farm.output.shard_reader", DeprecationWarning, stacklevel=2)
