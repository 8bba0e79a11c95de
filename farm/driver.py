"""Moved to ``farm.run.batch`` (issue 29: the run session, ``farm/run/``, starts every
run); ``farm.driver.run_farm`` keeps working for one release.
"""

import warnings

from farm.run.batch import run_batch
from farm.run.batch import run_batch as run_farm

__all__ = ["run_batch", "run_farm"]

warnings.warn("farm.driver moved to farm.run.batch (run_farm is run_batch)", DeprecationWarning, stacklevel=2)
