"""Moved to ``farm.modeltext.builtin_tokenizer`` (issue 29: production builds the builtin
tokenizer, so it lives below the engine and the gateway, not in the test kit); this name
keeps working for one release."""

import warnings

from farm.modeltext.builtin_tokenizer import *  # noqa: F403

warnings.warn("farm.testing.tokenizer moved to farm.modeltext.builtin_tokenizer", DeprecationWarning, stacklevel=2)
