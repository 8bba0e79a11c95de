"""Install a repository's requirements file into this venv the way SWE-bench's harness reads it.

This file is data to farm: ``farm.tasks.venvs`` puts its text in a setup command that the
venv's own python runs (``.venv/bin/python - PATH... <<...``, uv on PATH); farm never
imports it. It runs in the task's environment: Python 3.5+, the standard library, and uv.

SWE-bench's harness (``get_requirements_by_commit``) takes the first of the repository's
requirements paths that exists, puts the files its ``-r`` lines name in place of those lines,
and drops every line that installs the checkout itself (``-e .``, ``.[test...``) or is a
comment: the environment holds the dependencies, the instance installs the checkout. An
included file's ``-e .[testutils]`` (pylint's requirements_test_min.txt) is dropped too,
where a filter of the top file alone would let it through and build the checkout in the
base environment. One addition of farm's: ``types-pkg_resources`` (gone from PyPI's
resolvable releases) is replaced by ``types-setuptools``, which carries those stubs now.
Files are read relative to the one that names them; an ``-r`` cycle is read once.
"""

import os
import re
import subprocess
import sys
import tempfile

_EXCLUDE = ("-e .", "#", ".[test")
_PKG_RESOURCES_STUBS = re.compile(r"^types-pkg_resources([<>=!~].*)?$")


def read(path, seen):
    """The requirement lines of ``path`` with its ``-r`` files in place, SWE-bench's filter applied."""
    real = os.path.realpath(path)
    if real in seen:
        return []
    seen.add(real)
    out = []
    with open(path) as f:
        for line in f.read().splitlines():
            stripped = line.strip()
            if stripped.startswith(("-r", "--requirement")):
                name = stripped.split(None, 1)[1] if " " in stripped else stripped[2:]
                included = os.path.join(os.path.dirname(path), name.strip())
                if os.path.isfile(included):
                    out.extend(read(included, seen))
                continue
            if not stripped or stripped.startswith(_EXCLUDE):
                continue
            if stripped.startswith(("-c", "--constraint")):  # read from elsewhere: its path made absolute
                name = stripped.split(None, 1)[1] if " " in stripped else stripped[2:]
                stripped = "-c " + os.path.abspath(os.path.join(os.path.dirname(path), name.strip()))
            out.append(_PKG_RESOURCES_STUBS.sub(r"types-setuptools", stripped))
    return out


def main(candidates):
    found = next((p for p in candidates if os.path.isfile(p)), None)
    if found is None:
        sys.stderr.write("none of " + " ".join(candidates) + " in the checkout\n")
        return 1
    lines = read(found, set())
    if not lines:
        return 0
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(lines) + "\n")
    try:
        return subprocess.call(["uv", "pip", "install", "-q", "--python", sys.executable, "-r", f.name])
    finally:
        os.unlink(f.name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
