"""How a recipe's venv stands in for SWE-bench's conda environment: the steps farm adds.

SWE-bench's harness builds each environment as a conda environment; the recipe book
restates it as a venv made with uv in the workdir (``.venv``). farm closes the differences
that matter to the tests with setup steps of its own; each step's script is a file of this
package that runs in the task's environment with the venv's python, never in farm's.

One runs after every recipe's commands that make its venv:

- **A venv is not a prefix** (``venv_prefix_script.py``): its python is a link to the base
  interpreter, so whatever starts python through another path (tox-current-env's
  ``.tox/<env>/bin/python`` link to ``sys.executable``; ``os.path.realpath(sys.executable)``)
  runs the bare base interpreter without the venv's packages. ``prefix_step`` makes the
  venv self-contained, as a conda environment is.

Two are steps a recipe names where they run, among its own commands (``expand``):

- ``farm-requirements PATH...`` (``requirements_script.py``): the first of the repository's
  requirements files that exists, read as SWE-bench's harness reads it (``-r`` files in
  place, the lines that install the checkout itself dropped, in included files too).
- ``farm-conda-env FILE`` (``conda_env_script.py``): the spec's conda environment file in the
  checkout (xarray's ``ci/requirements/environment.yml``): what PyPI has of it is installed,
  and what it left out is printed, one ``farm-left-out: NAME: WHY`` line each, which
  ``left_out`` reads back into the setup's report: the environment's record and the
  validation report name them, and a test that fails on a missing module says which package
  was left out.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path

LEFT_OUT_MARK = "farm-left-out: "
_HERE = Path(__file__).parent
_VENV = ".venv"


def _script(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


def _run_with_venv_python(script: str, *args: str) -> str:
    """Bash: the venv's python runs ``script`` (given on stdin) when the workdir has a venv."""
    argv = "".join(" " + shlex.quote(a) for a in args)
    return f"if [ -f {_VENV}/pyvenv.cfg ]; then {_VENV}/bin/python -{argv} <<'FARM_PY'\n{script.rstrip()}\nFARM_PY\nfi"


def prefix_step() -> str:
    """The base setup step that makes the workdir's ``.venv`` a self-contained prefix (a no-op
    without one, or once done)."""
    return _run_with_venv_python(_script("venv_prefix_script.py"))


def conda_env_step(env_file: str) -> str:
    """The base setup step that installs into ``.venv`` what PyPI has of the conda
    environment file ``env_file`` (workdir-relative), printing what it leaves out."""
    return _run_with_venv_python(_script("conda_env_script.py"), env_file)


def requirements_step(paths: Sequence[str]) -> str:
    """The base setup step that installs the first of ``paths`` (the repository's requirements
    files, workdir-relative) as SWE-bench's harness reads it (``requirements_script.py``)."""
    return _run_with_venv_python(_script("requirements_script.py"), *paths)


# The steps a recipe names among its commands (``farm-requirements requirements_test.txt``),
# each replaced by the command that carries it out.
FARM_STEPS = {"farm-requirements": requirements_step, "farm-conda-env": lambda args: conda_env_step(*args)}


def step_error(command: str) -> str | None:
    """What is wrong with a command that names one of farm's steps (None: nothing, or not one)."""
    if not command.startswith("farm-"):
        return None
    words = shlex.split(command)
    if words[0] not in FARM_STEPS:
        return f"unknown step {words[0]!r} (farm's steps: {', '.join(FARM_STEPS)})"
    if words[0] == "farm-conda-env" and len(words) != 2:
        return "farm-conda-env takes one file"
    if len(words) < 2:
        return f"{words[0]} takes one or more paths"
    return None


def expand(command: str) -> str:
    """``command``, or the command that carries out the step it names."""
    if step_error(command) is not None or not command.startswith("farm-"):
        return command
    name, *args = shlex.split(command)
    return FARM_STEPS[name](args)


def left_out(stdouts: Iterable[str]) -> list[str]:
    """What the setup steps said they left out (``NAME: WHY``), in order, once each."""
    found: dict[str, None] = {}
    for text in stdouts:
        for line in text.splitlines():
            if line.startswith(LEFT_OUT_MARK):
                found.setdefault(line[len(LEFT_OUT_MARK) :].strip(), None)
    return list(found)
