"""Moved to ``farm.simulator`` (issue 29: the simulated policy worker is no part of the
engine's client side); this name keeps working for one release."""

import importlib
import warnings

warnings.warn("farm.engine.scripted moved to farm.simulator", DeprecationWarning, stacklevel=2)


def __getattr__(name: str):
    return getattr(importlib.import_module("farm.simulator"), name)
