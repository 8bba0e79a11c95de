"""Moved to ``farm.modeltext`` (issue 29: a name that says what it holds, the policy
model's text, apart from ``rollout/`` and ``tasks/`` models). ``farm.model.tokenizer``
and ``farm.model.toolcalls`` keep working for one release."""

import warnings

warnings.warn("farm.model moved to farm.modeltext", DeprecationWarning, stacklevel=2)
