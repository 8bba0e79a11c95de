"""Install into this venv what PyPI has of a conda environment file; name what it leaves out.

This file is data to farm: ``farm.tasks.venvs`` puts its text in a setup command that the
venv's own python runs (``.venv/bin/python - FILE <<...``, uv on PATH); farm never imports
it. It runs in the task's environment: Python 3.6+, the standard library, and uv.

SWE-bench builds some repositories' environments from a conda environment file
(xarray's ``ci/requirements/environment.yml``, matplotlib's ``environment.yml``), then
pip-installs the spec's ``pip_packages`` over it. Most of such a file is on PyPI too; some
of it is not (cdms2, esmpy: conda only), or does not build here. A package that only conda
provides must not refuse the rows that never import it, so this installs every entry PyPI
can provide, one at a time, each with what the venv already holds kept at its versions (the
spec's pins, installed by the base setup before this step, win as they do in SWE-bench's
image; wheels first, a source build only when no wheel will do), and leaves out each entry
uv cannot provide: not on PyPI, no version compatible with the rest, failing to build, or
no answer within 15 minutes; and each one that installs but fails to import with other than
an ImportError (cfgrib's wheel without the ecCodes C library conda ships beside it: a test
suite's import-or-skip would crash on it), which is uninstalled again. Each one left out is printed last,
one line each, as ``farm-left-out: NAME: WHY``; farm reads these lines into the
environment's record (``SetupReport.left_out``) and names them when a test fails on a
missing module. The file is read without a YAML library (the venv has none): conda
environment files are a ``dependencies:`` list of strings with an optional ``pip:``
sub-list, which is all this reads.
"""

import os
import re
import subprocess
import sys
import tempfile

# conda package -> its PyPI name (None: nothing to install from PyPI: conda's own tooling).
CONDA_TO_PYPI = {
    "python": None, "pip": None, "conda": None, "mamba": None,
    "matplotlib-base": "matplotlib", "iris": "scitools-iris", "python-graphviz": "graphviz",
    "pytables": "tables", "msgpack-python": "msgpack", "pyqt": "pyqt5", "pytorch": "torch",
    "libgdal": None, "proj": None, "geos": None,
}
MARK = "farm-left-out: "
TIMEOUT_S = 900  # one package's install: a resolver lost in old releases gives up
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)$")
_NOT_FOUND = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the package registry")
_NO_VERSIONS = re.compile(r"there (?:are|is) no versions? of ([A-Za-z0-9][A-Za-z0-9._-]*)")
_BUILD = re.compile(r"Failed to (?:build|download and build|prepare distributions)[^`]*`([A-Za-z0-9][A-Za-z0-9._-]*)")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_env_file(path):
    """(conda entries, pip entries) of a conda environment file, as written."""
    conda, pip = [], []
    in_deps, item_indent, pip_indent = False, None, None
    with open(path) as f:
        lines = f.read().splitlines()
    for raw in lines:
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.strip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        text = line.strip()
        if not text.startswith("-"):
            if indent == 0:
                in_deps = text.rstrip(":").strip() == "dependencies"
                item_indent = pip_indent = None
            continue
        if not in_deps:
            continue
        value = text[1:].strip().strip("'\"")
        if item_indent is None:
            item_indent = indent
        if pip_indent is not None and indent > item_indent:
            pip.append(value)
            continue
        pip_indent = None
        if value.rstrip(":") == "pip" and value.endswith(":"):
            pip_indent = indent
        elif value:
            conda.append(value)
    return conda, pip


def conda_to_requirement(spec):
    """A conda match spec as a PyPI requirement (None: nothing to install from PyPI)."""
    spec = spec.split("::")[-1].strip()
    m = _NAME.match(spec)
    if m is None:
        return None
    name, extras, rest = m.group(1), m.group(2) or "", m.group(3).strip()
    mapped = CONDA_TO_PYPI.get(name.lower(), name)
    if mapped is None:
        return None
    rest = rest.replace(" ", "")
    if rest.startswith("=") and not rest.startswith("=="):  # conda's name=1.2[=build]: that release series
        version = rest[1:].split("=")[0]
        rest = "==" + version + ("" if version.endswith("*") else ".*")
    elif rest and rest[0].isdigit():
        rest = "==" + rest
    return mapped + extras + rest


def installed(python):
    out = subprocess.run(["uv", "pip", "freeze", "--python", python], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True, check=False)
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip() and not ln.startswith(("-e", "#"))]


def name_of(line):
    """The normalized project name of a requirement or freeze line ('x==1', 'x @ file://...')."""
    m = _NAME.match(line)
    return norm(m.group(1)) if m else line


def why_not(message):
    """Why uv could not install a package, in a few words."""
    if _NOT_FOUND.search(message):
        return "not on PyPI"
    if _NO_VERSIONS.search(message):
        return "no version on PyPI for this environment"
    if _BUILD.search(message):
        return "fails to build here"
    if "No solution found" in message or "unsatisfiable" in message:
        return "no version compatible with the environment's packages"
    last = [ln.strip() for ln in message.splitlines() if ln.strip()]
    return "uv: " + (last[-1][:200] if last else "failed")


def install(python, requirement, constraints, build):
    """uv installs ``requirement`` with what the venv holds kept at its versions: None when it
    did, else uv's message. Without ``build``, wheels only (no source build to read metadata:
    a resolver walking old releases builds each one)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(constraints) + "\n")
    cmd = ["uv", "pip", "install", "-q", "--python", python, "-c", f.name] + ([] if build else ["--no-build"])
    try:
        res = subprocess.run(cmd + [requirement], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             universal_newlines=True, check=False, timeout=TIMEOUT_S)
        return None if res.returncode == 0 else res.stdout
    except subprocess.TimeoutExpired:
        return "uv: no answer within %d s" % TIMEOUT_S
    finally:
        os.unlink(f.name)


def top_level(python, name):
    """The modules a distribution installs at the top level (empty: unknown)."""
    code = ("import sys\ntry:\n    from importlib import metadata\nexcept ImportError:\n    sys.exit(0)\n"
            "d = metadata.distribution(sys.argv[1])\ntop = (d.read_text('top_level.txt') or '').split()\n"
            "if not top:\n    top = sorted({str(f).split('/')[0].split('.')[0] for f in (d.files or [])\n"
            "                  if str(f).endswith('.py') and '/' in str(f) and '.dist-info' not in str(f)})\n"
            "print(' '.join(t for t in top if t.isidentifier() and not t.startswith('_') and t != 'tests'))\n")
    res = subprocess.run([python, "-c", code, name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         universal_newlines=True, check=False, timeout=120)
    return res.stdout.split() if res.returncode == 0 else []


def import_failure(python, modules):
    """The first of ``modules`` whose import fails with other than an ImportError (a library
    the package needs that conda ships and PyPI's wheel does not), as its error line."""
    for module in modules:
        code = ("import importlib, sys\ntry:\n    importlib.import_module(sys.argv[1])\nexcept ImportError:\n"
                "    pass\nexcept BaseException as e:\n    print(type(e).__name__ + ': ' + str(e)[:200])\n")
        try:
            res = subprocess.run([python, "-c", code, module], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 universal_newlines=True, check=False, timeout=300)
        except subprocess.TimeoutExpired:
            return "import %s: no answer within 300 s" % module
        if res.stdout.strip() or res.returncode != 0:
            return "import %s: %s" % (module, (res.stdout.strip() or res.stderr.strip()[-200:]))
    return None


def uninstall(python, before):
    """Uninstall what was installed since ``before`` (a freeze), and put back what it replaced."""
    now = installed(python)
    old = {name_of(k): k for k in before}
    added = [name_of(k) for k in now if name_of(k) not in old]
    changed = [old[name_of(k)] for k in now if name_of(k) in old and k not in before]
    if added:
        subprocess.run(["uv", "pip", "uninstall", "-q", "--python", python] + added, check=False)
    if changed:
        subprocess.run(["uv", "pip", "install", "-q", "--python", python] + changed, check=False)


def main(argv):
    path = argv[0]
    python = sys.executable
    if not os.path.isfile(path):
        print(MARK + path + ": the environment file is not in this checkout")
        return 0
    conda, pip = read_env_file(path)
    reqs = [conda_to_requirement(c) for c in conda] + [p for p in pip if not p.startswith(("-e", "-r", "."))]
    wanted = {}
    for req in reqs:
        m = req and _NAME.match(req)
        if m:
            wanted.setdefault(norm(m.group(1)), req)
    left_out = []
    # One package at a time, each kept compatible with all the venv holds (the spec's pins
    # first): a package that cannot be had is left out alone, and no resolution has to
    # search the whole file's combinations at once.
    for name, req in wanted.items():
        keep = installed(python)
        if name in {name_of(k) for k in keep}:
            continue  # the base setup installed it (the spec's version wins)
        message = install(python, req, keep, build=False)
        if message is not None:
            message = install(python, req, keep, build=True)
        if message is not None:
            left_out.append((req, why_not(message)))
            continue
        broken = import_failure(python, top_level(python, name))
        if broken is not None:  # installed, but unusable here: the tests would crash on it
            uninstall(python, keep)
            left_out.append((req, "installs from PyPI but does not import here (" + broken + ")"))
    for req, why in left_out:
        print(MARK + req + ": " + why)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
