"""Building the docs site, for the site fixture and the test that the build is strict."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_site(dest: Path, config: Path = ROOT / "mkdocs.yml") -> subprocess.CompletedProcess:
    """`mkdocs build --strict` (warnings are errors: broken links and anchors, missing
    pages, unknown snippets) into ``dest``."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(dest)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
