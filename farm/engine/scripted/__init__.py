"""Moved to ``farm.simulator`` (issue 29: the simulated policy worker is no part of the
engine's client side); this name and the submodules the docs named (choose, endless,
oracle, policy, protocol, scoring) keep working for one release."""

import warnings

from farm.simulator import *  # noqa: F403

warnings.warn("farm.engine.scripted moved to farm.simulator", DeprecationWarning, stacklevel=2)
