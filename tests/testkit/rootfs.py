"""A small Debian root file system assembled from this host's installed packages (no network).

``debian_rootfs(dest, ["bash", "git", "python3", "python3-pytest"])`` copies the files dpkg
lists for those packages and everything they depend on (their ``Depends`` and
``Pre-Depends``, alternatives resolved to the installed one), less what the tests and the
benchmark never need (``EXCLUDED``: perl, documentation), with the host's merged-/usr links
and a minimal ``/etc``. It is what ``mmdebstrap`` would lay down from the same ``.deb``s,
in a second instead of minutes from a mirror: the images farm's tests build in each
dataset's layout start from it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

EXCLUDED = frozenset({"perl", "perl-base", "perl-modules-5.36", "libperl5.36", "git-man", "liberror-perl",
                      "debconf", "dpkg", "install-info", "man-db", "sensible-utils", "tzdata"})  # fmt: skip
_SKIP_PREFIXES = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/", "/usr/share/lintian/")


def _installed() -> dict[str, tuple[list[list[str]], list[str]]]:
    """package -> (its dependencies as lists of alternatives, what it provides)."""
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${db:Status-Abbrev}\t${Depends}\t${Pre-Depends}\t${Provides}\n"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    pkgs: dict[str, tuple[list[list[str]], list[str]]] = {}
    for line in out.splitlines():
        name, status, deps, pre, provides = (line.split("\t") + [""] * 5)[:5]
        if not status.startswith("ii"):
            continue
        alts = []
        for group in filter(None, (", ".join(x for x in (deps, pre) if x)).split(", ")):
            alts.append([re.split(r"[ :(]", a.strip(), maxsplit=1)[0] for a in group.split("|")])
        prov = [re.split(r"[ (]", p.strip(), maxsplit=1)[0] for p in provides.split(",") if p.strip()]
        pkgs[name] = (alts, prov)
    return pkgs


def closure(packages: list[str]) -> list[str]:
    """``packages`` and every installed package they need (``EXCLUDED`` left out)."""
    pkgs = _installed()
    providers: dict[str, str] = {}
    for name, (_, prov) in pkgs.items():
        for p in prov:
            providers.setdefault(p, name)
    want, seen = list(packages), set()
    while want:
        name = want.pop()
        name = name if name in pkgs else providers.get(name, name)
        if name in seen or name in EXCLUDED:
            continue
        if name not in pkgs:
            raise RuntimeError(f"package {name} is not installed on this host (apt-get install {name})")
        seen.add(name)
        for alternatives in pkgs[name][0]:
            pick = next((a for a in alternatives if a in pkgs or a in providers), None)
            if pick is not None:
                want.append(pick)
    return sorted(seen)


def debian_rootfs(dest: Path, packages: list[str]) -> list[str]:
    """Assemble the root file system at ``dest``; returns the packages it holds."""
    dest.mkdir(parents=True, exist_ok=True)
    for top in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):  # merged /usr, as the host has it
        if os.path.islink(f"/{top}"):
            (dest / top).symlink_to(os.readlink(f"/{top}"))
    names = closure(packages)
    files = subprocess.run(["dpkg-query", "-L", *names], capture_output=True, text=True, check=True).stdout
    for path in sorted(set(files.splitlines())):
        if not path.startswith("/") or path.startswith(_SKIP_PREFIXES) or path in ("/", "/."):
            continue
        real_dir = os.path.realpath(os.path.dirname(path))  # /bin/bash is /usr/bin/bash on merged /usr
        src = os.path.join(real_dir, os.path.basename(path))
        if not os.path.lexists(src):
            continue  # a conffile removed on the host, a diverted file
        target = dest / src.lstrip("/")
        if os.path.isdir(src) and not os.path.islink(src):
            target.mkdir(parents=True, exist_ok=True)
            shutil.copystat(src, target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(target):
            shutil.copy2(src, target, follow_symlinks=False)
    etc = dest / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (etc / "os-release").write_text('PRETTY_NAME="farm test image (Debian packages of the host)"\nID=debian\n')
    for d, mode in (("root", 0o700), ("tmp", 0o1777), ("proc", 0o555), ("dev", 0o755), ("run", 0o755), ("var/tmp", 0o1777)):
        (dest / d).mkdir(parents=True, exist_ok=True)
        os.chmod(dest / d, mode)
    return names
