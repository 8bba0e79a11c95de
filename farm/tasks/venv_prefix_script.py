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
by the binary's absolute run path), the base's standard library in its ``lib/pythonX.Y``
(Python finds its prefix by a landmark, ``lib/pythonX.Y/os.py``, searched upward from the
binary's real location), the base's headers linked into its ``include``, and
``pyvenv.cfg``'s ``home`` pointed at its own ``bin`` so that Python 3.6-3.10, which read
``pyvenv.cfg`` beside the resolved binary, compute the same prefix. Started by any path,
``sys.prefix`` is then the venv and its site-packages are on ``sys.path``.

The standard library is the venv's own files, not links to the base's: code that asks
whether a module is the standard library's compares the module's real path with the
standard library's directory (astroid's ``is_standard_module``, which pylint's import checks
use), and a link resolves outside the venv. The files are hard links where the file system
allows (a sandbox's bind mount does not: then copies, some 25-40 MB); the parts no test
suite asks about and that are large (the ``test`` package, idlelib, tkinter, turtledemo,
ensurepip, the static library in ``config-*``) stay links.
"""

import os
import shutil
import sys


LINKED = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip")


def place(src, dst, state):
    """The file ``src`` at ``dst``: a hard link, else (another mount, not the owner) a copy."""
    if state["link"]:
        try:
            os.link(src, dst)
            return
        except OSError:
            state["link"] = False  # the same refusal for every other file: copy from now on
    shutil.copy2(src, dst)


def mirror(src, dst, state):
    """The tree ``src`` at ``dst``: directories made, files placed, symbolic links kept."""
    for root, dirs, files in os.walk(src):
        out = os.path.join(dst, os.path.relpath(root, src))
        os.makedirs(out, exist_ok=True)
        for name in list(dirs) + files:
            path, target = os.path.join(root, name), os.path.join(out, name)
            if os.path.islink(path):
                if name in dirs:
                    dirs.remove(name)  # os.walk does not descend into it: kept as the link it is
                if not os.path.lexists(target):
                    os.symlink(os.readlink(path), target)
            elif name in files and not os.path.lexists(target):
                place(path, target, state)


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
    state = {"link": True}
    for sub in (os.path.join("lib", version), "include"):
        src, dst = os.path.join(base, sub), os.path.join(venv, sub)
        if not os.path.isdir(src):
            continue
        os.makedirs(dst, exist_ok=True)
        for entry in os.listdir(src):
            path, target = os.path.join(src, entry), os.path.join(dst, entry)
            if entry == "site-packages":
                continue
            if sub == "include" or entry in LINKED or entry.startswith("config-") or os.path.islink(path):
                if not os.path.lexists(target):
                    os.symlink(path, target)
            elif os.path.isdir(path):
                mirror(path, target, state)
            elif not os.path.lexists(target):
                place(path, target, state)
    cfg = os.path.join(venv, "pyvenv.cfg")
    with open(cfg) as f:
        lines = [ln for ln in f.read().splitlines() if ln.partition("=")[0].strip() != "home"]
    with open(cfg, "w") as f:
        f.write("\n".join(["home = " + bindir] + lines) + "\n")


main()
