"""The output directory's tests: the helper modules of tests/trajectory (turn trees to
write) and tests/farm (formats) are put on sys.path here (pytest puts only this directory
there)."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for sub in ("trajectory", "farm"):
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))
