"""Moved to ``farm.output.artifacts`` (issue 29: the output directory lives in ``farm/output/``); this
name keeps working for one release."""

import warnings

from farm.output.artifacts import *  # noqa: F403
from farm.output.config import ArtifactsConfig  # noqa: F401

warnings.warn("farm.rollout.artifacts moved to farm.output.artifacts", DeprecationWarning, stacklevel=2)
