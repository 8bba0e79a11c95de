"""Fill a git submodule of the checkout from its package's source release on PyPI.

This file is data to farm: ``farm.tasks.venvs`` puts its text in a setup command that the
venv's own python runs (``.venv/bin/python - PATH PACKAGE <<...``); farm never imports it.
It runs in the task's environment: Python 3.5+ and the standard library.

Some checkouts build with a submodule: astropy up to 4.0 vendors ``astropy_helpers`` (its
``ah_bootstrap.py`` imports it from there, else runs ``git submodule update`` against
GitHub, else asks PyPI through setuptools' old easy_install). SWE-bench's harness builds
with the network; farm's mirrors hold the repository but not its submodules, and their host
may be out of reach. The submodule's project publishes its releases on PyPI, so this puts
the source release that matches the checkout at PATH. With FILE (``farm-submodule PATH PACKAGE
FILE``: a file the project copies into the checkouts that vendor it, astropy's
``ah_bootstrap.py``), the release whose copy of FILE is the checkout's, looked for among the
releases uploaded nearest the checkout's commit date (the nearest, or a later bugfix release
of its series with the same FILE); without FILE, or when none matches, the
highest version (pre-releases included: a development checkout tracked the next release) whose
sdist was uploaded before the checkout's commit date (``git log -1 --format=%cI``), else the
oldest one after. Each download's sha256 is checked against PyPI's. Nothing is done when the
checkout's commit does not hold PATH as a submodule, or when PATH already holds a project
(``setup.py`` or ``pyproject.toml``: the submodule was checked out). One line says what was
put there and why: ``farm-submodule: PATH <- PACKAGE VERSION (...)``.

The index is PyPI's JSON API (``FARM_PYPI_URL``, default https://pypi.org/pypi): a simple
index alone (a mirror) does not give upload dates.
"""

import datetime
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import urllib.request
import zipfile

MAX_TRIES = 16  # source releases downloaded looking for the one whose FILE is the checkout's
PYPI = os.environ.get("FARM_PYPI_URL", "https://pypi.org/pypi").rstrip("/")
_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[.-]?(dev|alpha|a|beta|b|rc|c)\.?(\d*))?")
_PRE_RANK = {"dev": -4, "a": -3, "alpha": -3, "b": -2, "beta": -2, "rc": -1, "c": -1}


def version_key(version):
    """A sort key for PEP 440 versions with the standard library alone: 3.0rc2 < 3.0 == 3.0.0 < 3.0.1."""
    m = _VERSION.match(version.lower())
    if not m:
        return (), (-9, 0)
    release = [int(x) for x in m.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    pre = (_PRE_RANK[m.group(2)], int(m.group(3) or 0)) if m.group(2) else (0, 0)
    return tuple(release), pre


def parse_time(text):
    return datetime.datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")


def commit_time():
    out = subprocess.check_output(["git", "log", "-1", "--format=%cI"], universal_newlines=True).strip()
    when = datetime.datetime.strptime(out[:19], "%Y-%m-%dT%H:%M:%S")
    sign = 1 if out[19] == "+" else -1
    offset = datetime.timedelta(hours=int(out[20:22]), minutes=int(out[23:25]))
    return when - sign * offset  # UTC, as PyPI's upload times are


def dated(releases):
    """(upload time, version, sdist file record) of every release with a source distribution."""
    out = []
    for version, files in releases.items():
        sdists = [f for f in files if f.get("packagetype") == "sdist" and not f.get("yanked")]
        if sdists:
            out.append((parse_time(sdists[0].get("upload_time_iso_8601") or sdists[0]["upload_time"]), version,
                        sdists[0]))
    return out


def pick(releases, when):
    """(version, sdist file record) of the highest release uploaded before ``when``, else the
    oldest one after, or None."""
    releases = dated(releases)
    before = [d for d in releases if d[0] <= when]
    if before:
        return max(before, key=lambda d: version_key(d[1]))[1:]
    after = sorted(releases, key=lambda d: d[0])
    return after[0][1:] if after else None


def unpack(data, filename, path):
    """The sdist's files under its top directory, written under ``path``."""
    os.makedirs(path, exist_ok=True)
    if filename.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for info in z.infolist():
                parts = info.filename.split("/", 1)
                if len(parts) == 2 and parts[1] and ".." not in parts[1].split("/"):
                    target = os.path.join(path, parts[1])
                    if info.filename.endswith("/"):
                        os.makedirs(target, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        with open(target, "wb") as f:
                            f.write(z.read(info))
        return
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) < 2 or not parts[1] or ".." in parts[1].split("/") or not (member.isfile() or member.isdir()):
                continue
            target = os.path.join(path, parts[1])
            if member.isdir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(tar.extractfile(member).read())
            os.chmod(target, member.mode & 0o755 | 0o644)


def is_submodule(path):
    """Whether the checkout's commit holds ``path`` as a submodule (a gitlink, mode 160000)."""
    out = subprocess.check_output(["git", "ls-tree", "HEAD", "--", path.rstrip("/")], universal_newlines=True)
    return out.startswith("160000 ")


def fetch(sdist):
    """The sdist's bytes, its sha256 checked against PyPI's (None: it does not match)."""
    with urllib.request.urlopen(sdist["url"], timeout=300) as r:
        data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != sdist["digests"]["sha256"]:
        sys.stderr.write("farm-submodule: {} sha256 {} is not PyPI's {}\n".format(sdist["filename"], digest,
                                                                                 sdist["digests"]["sha256"]))
        return None
    return data


def member(data, filename, relpath):
    """The bytes of ``relpath`` under the sdist's top directory, or None."""
    try:
        if filename.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                names = [n for n in z.namelist() if n.split("/", 1)[-1] == relpath]
                return z.read(names[0]) if names else None
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar.getmembers():
                if m.isfile() and m.name.split("/", 1)[-1] == relpath:
                    return tar.extractfile(m).read()
    except (tarfile.TarError, zipfile.BadZipFile, OSError):
        return None
    return None


def matching(releases, when, same, theirs):
    """(version, sdist, bytes) of the release whose copy of ``same`` is the checkout's: of the
    MAX_TRIES releases uploaded nearest the checkout's date, the nearest one that matches, or
    the latest bugfix release of its series that matches too (3.2's sdist left out a source file
    that 3.2.1 ships), or None."""
    near = sorted(dated(releases), key=lambda d: abs((d[0] - when).total_seconds()))
    found, series = [], None
    for _, version, sdist in near[:MAX_TRIES]:
        if series is not None and version_key(version)[0][:2] != series:
            continue  # once one matches, only its series' bugfix releases are downloaded
        data = fetch(sdist)
        if data is not None and member(data, sdist["filename"], same) == theirs:
            found.append((version, sdist, data))
            series = version_key(version)[0][:2]
    return max(found, key=lambda f: version_key(f[0])) if found else None


def main(path, package, same=None):
    if not is_submodule(path):
        return 0  # this checkout does not vendor it (the recipe serves versions before and after)
    if os.path.isfile(os.path.join(path, "setup.py")) or os.path.isfile(os.path.join(path, "pyproject.toml")):
        return 0
    when = commit_time()
    with urllib.request.urlopen("{}/{}/json".format(PYPI, package), timeout=60) as r:
        releases = json.loads(r.read().decode("utf-8"))["releases"]
    found = None
    if same and os.path.isfile(same):
        with open(same, "rb") as f:
            found = matching(releases, when, same, f.read())
    how = "its {} is the checkout's".format(same) if found else "the newest source release uploaded before the checkout's commit, {}".format(when.date())
    if found is None:
        chosen = pick(releases, when)
        if chosen is None:
            sys.stderr.write("farm-submodule: {} has no source release on {}\n".format(package, PYPI))
            return 1
        data = fetch(chosen[1])
        if data is None:
            return 1
        found = (chosen[0], chosen[1], data)
    version, sdist, data = found
    unpack(data, sdist["filename"], path)
    print("farm-submodule: {} <- {} {} ({}; the submodule's own repository is not fetched)".format(
        path, package, version, how))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
