"""Moved to ``farm.output.writer`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.writer import *  # noqa: F403

warnings.warn("farm.rollout.store moved to farm.output.writer", DeprecationWarning, stacklevel=2)
