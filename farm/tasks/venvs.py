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

Five are steps a recipe names where they run, among its own commands (``expand``):

- ``farm-requirements PATH...`` (``requirements_script.py``): the first of the repository's
  requirements files that exists, read as SWE-bench's harness reads it (``-r`` files in
  place, the lines that install the checkout itself dropped, in included files too).
- ``farm-httpbin`` (``httpbin_script.py``): a local httpbin for tests that call one (requests up
  to 2.8: ``HTTPBIN_URL``), http and https on one port of the sandbox's loopback, in a venv of
  its own; a test command starts it (``HTTPBIN_URL``).
- ``farm-conda-env FILE`` (``conda_env_script.py``): the spec's conda environment file in the
  checkout (xarray's ``ci/requirements/environment.yml``): what PyPI has of it is installed,
  and what it left out is printed, one ``farm-left-out: NAME: WHY`` line each, which
  ``left_out`` reads back into the setup's report: the environment's record and the
  validation report name them, and a test that fails on a missing module says which package
  was left out.
- ``farm-install-editable``: the checkout installed editable into ``.venv`` by uv, as the spec's
  ``pip install -e .``; where uv refuses because the checkout's build backend has no PEP 660
  hook (setuptools < 64 pinned in its pyproject.toml: pylint-dev__astroid-1741), by the
  venv's pip, which falls back to ``setup.py develop`` as SWE-bench's spec does. Any other
  failure of uv stays the step's failure (pip does not retry what uv refused for a reason).
- ``farm-submodule PATH PACKAGE [FILE]`` (``submodule_script.py``): a submodule the checkout
  builds with (astropy's ``astropy_helpers``) that farm's mirror does not hold, filled from
  PACKAGE's source release on PyPI that matches the checkout (its copy of FILE is the
  checkout's, else the release of the checkout's date); a no-op when the commit holds no
  submodule at PATH or it is already there.
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


def submodule_step(path: str, package: str, same: str | None = None) -> str:
    """The setup step that fills the checkout's submodule ``path`` from ``package``'s source
    release on PyPI (``submodule_script.py``; the one whose copy of the checkout's file ``same``
    is identical, when given): run before the step that builds the checkout."""
    return _run_with_venv_python(_script("submodule_script.py"), path, package, *([same] if same else []))


def editable_step() -> str:
    """The setup step that installs the checkout editable (``farm-install-editable``): uv, else
    pip where uv's only complaint is a build backend without PEP 660's ``build_editable`` (pip
    falls back to ``setup.py develop``: only a pip before 25.1, which a recipe's UV_EXCLUDE_NEWER
    seeds the venv with)."""
    uv = f"uv pip install -q --python {_VENV}/bin/python -e ."
    said = "farm-install-editable: uv cannot install the checkout editable (its build backend has no PEP 660 hook): pip installs it"
    # uv wraps its report to the terminal's width (in CI too): its words are matched unwrapped
    return (f"{{ out=$({uv} 2>&1) && printf '%s' \"$out\" || case \"$(printf '%s' \"$out\" | tr -s ' \\n' '  ')\" in "
            f"*\"has no attribute 'build_editable'\"*) printf '%s\\n%s\\n' \"$out\" {shlex.quote(said)} >&2 && "
            f"{_VENV}/bin/python -m pip install -q -e . ;; "
            f"*) printf '%s\\n' \"$out\" >&2; false ;; esac; }}")  # fmt: skip


HTTPBIN = f"{_VENV}/httpbin"
HTTPBIN_URL = f"$({HTTPBIN}/bin/python {HTTPBIN}/serve.py)"  # a test command's: starts it, prints its URL


def httpbin_step() -> str:
    """The base setup step that makes a local httpbin for the tests (``httpbin_script.py``): a
    venv of its own in ``.venv/httpbin`` (PyPI's httpbin, apart from the code under test), its
    script, a certificate for ``localhost`` and httpbin.org (``.venv/httpbin/cert.pem``, for the CA
    bundle the tests trust), and the test venv's shim that resolves httpbin.org to it. A test
    command starts it with ``HTTPBIN_URL``'s expansion."""
    site = f"\"$({_VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\""
    return (f"uv venv -q {HTTPBIN} && uv pip install -q --python {HTTPBIN}/bin/python httpbin==0.10.2 cryptography && "
            f"cat > {HTTPBIN}/serve.py <<'FARM_PY' && {HTTPBIN}/bin/python {HTTPBIN}/serve.py --make-cert && "
            f"{HTTPBIN}/bin/python {HTTPBIN}/serve.py --hosts-shim {site}\n"
            f"{_script('httpbin_script.py').rstrip()}\nFARM_PY")  # fmt: skip


# The steps a recipe names among its commands (``farm-requirements requirements_test.txt``),
# each replaced by the command that carries it out: (how many arguments, the step).
FARM_STEPS = {
    "farm-requirements": ((1, None), requirements_step),
    "farm-conda-env": ((1, 1), lambda args: conda_env_step(*args)),
    "farm-httpbin": ((0, 0), lambda args: httpbin_step()),
    "farm-install-editable": ((0, 0), lambda args: editable_step()),
    "farm-submodule": ((2, 3), lambda args: submodule_step(*args)),
}
_TAKES = {(0, 0): "no argument", (1, 1): "one file", (1, None): "one or more paths", (2, 3): "a path, a package and optionally a file"}


def step_error(command: str) -> str | None:
    """What is wrong with a command that names one of farm's steps (None: nothing, or not one)."""
    if not command.startswith("farm-"):
        return None
    name, *args = shlex.split(command)
    if name not in FARM_STEPS:
        return f"unknown step {name!r} (farm's steps: {', '.join(FARM_STEPS)})"
    (least, most), _ = FARM_STEPS[name]
    if len(args) < least or (most is not None and len(args) > most):
        return f"{name} takes {_TAKES[least, most]}"
    return None


def expand(command: str) -> str:
    """``command``, or the command that carries out the step it names."""
    if step_error(command) is not None or not command.startswith("farm-"):
        return command
    name, *args = shlex.split(command)
    return FARM_STEPS[name][1](args)


def left_out(stdouts: Iterable[str]) -> list[str]:
    """What the setup steps said they left out (``NAME: WHY``), in order, once each."""
    found: dict[str, None] = {}
    for text in stdouts:
        for line in text.splitlines():
            if line.startswith(LEFT_OUT_MARK):
                found.setdefault(line[len(LEFT_OUT_MARK) :].strip(), None)
    return list(found)
