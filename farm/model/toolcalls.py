"""Moved to ``farm.modeltext.toolcalls`` (issue 29); this name keeps working for one release."""

import warnings

from farm.modeltext.toolcalls import *  # noqa: F403

warnings.warn("farm.model.toolcalls moved to farm.modeltext.toolcalls", DeprecationWarning, stacklevel=2)
