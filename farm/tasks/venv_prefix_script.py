"""Make the venv this interpreter runs in a self-contained prefix, as a conda environment is.

This file is data to farm: ``farm.tasks.venvs`` puts its text in a setup command that the
venv's own python runs (``.venv/bin/python - <<...``) after the recipe's base setup; farm
never imports it. It runs in the task's environment, so it keeps to Python 3.5+ and the
standard library.

Why: a venv's ``bin/python`` is a link to the base interpreter, and Python finds its venv
only from the path it was started by (a ``pyvenv.cfg`` beside it or one directory up).
Whatever starts the interpreter through another path loses the venv and runs the bare
base interpreter without the venv's packages: tox-current-env links ``.tox/<env>/bin/python``
to ``sys.executable`` (sphinx's test command), a test suite that runs
``os.path.realpath(sys.executable)``. SWE-bench's conda environment has none of this: its
python is a real binary inside a real prefix. So the venv becomes one: its python a copy
of the base binary (17 KB when the base is a shared-library build; its libpython is found
by the binary's absolute run path), the base's standard library and headers linked into
its ``lib/pythonX.Y`` and ``include`` (Python finds its prefix by a landmark,
``lib/pythonX.Y/os.py``, searched upward from the binary's real location), and
``pyvenv.cfg``'s ``home`` pointed at its own ``bin`` so that Python 3.6-3.10, which read
``pyvenv.cfg`` beside the resolved binary, compute the same prefix. Started by any path,
``sys.prefix`` is then the venv and its site-packages are on ``sys.path``.
"""

import os
import shutil
import sys


def main():
    venv = sys.prefix
    if venv == sys.base_prefix:
        return  # a prefix already (this ran before, or it is not a venv)
    base = sys.base_prefix
    version = "python%d.%d" % sys.version_info[:2]
    bindir = os.path.join(venv, "bin")
    exe = os.path.join(bindir, version)
    real = os.path.realpath(exe)
    if real != exe:
        tmp = exe + ".farm-tmp"
        shutil.copy2(real, tmp)
        os.replace(tmp, exe)
    for name in ("python", "python3"):
        link = os.path.join(bindir, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(version, link)
    for sub in (os.path.join("lib", version), "include"):
        src, dst = os.path.join(base, sub), os.path.join(venv, sub)
        if not os.path.isdir(src):
            continue
        os.makedirs(dst, exist_ok=True)
        for entry in os.listdir(src):
            target = os.path.join(dst, entry)
            if entry != "site-packages" and not os.path.lexists(target):
                os.symlink(os.path.join(src, entry), target)
    cfg = os.path.join(venv, "pyvenv.cfg")
    with open(cfg) as f:
        lines = [ln for ln in f.read().splitlines() if ln.partition("=")[0].strip() != "home"]
    with open(cfg, "w") as f:
        f.write("\n".join(["home = " + bindir] + lines) + "\n")


main()
