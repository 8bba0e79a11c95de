"""Moved to ``farm.modeltext.tokenizer`` (issue 29); this name keeps working for one release."""

import warnings

from farm.modeltext.tokenizer import *  # noqa: F403

warnings.warn("farm.model.tokenizer moved to farm.modeltext.tokenizer", DeprecationWarning, stacklevel=2)
