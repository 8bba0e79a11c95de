"""What a recipe needs from the machine beyond PyPI, and whether this machine has it.

SWE-bench builds its environments in docker images with apt (``pre_install`` steps, the
base image's build-essential and locales) and conda. A recipe restates the pip-installable
part as uv commands and lists the rest as ``requires``: each entry names what provides it
(``apt`` package, ``conda``-only package, a ``download`` from outside the package index)
and how farm sees it on this machine (``check``)::

    requires:
      - {apt: graphviz, check: "command:dot"}
      - {apt: build-essential, check: ["command:gcc", "command:g++"]}
      - {conda: "cdms2, esmpy", check: never}

Checks (all of an entry's must hold): ``command:NAME`` (an executable on PATH),
``library:NAME`` (a shared library the dynamic loader finds, as ``ctypes.util.find_library``),
``locale:NAME`` (listed by ``locale -a``), ``file:PATH`` (exists), ``never`` (no package
on this machine can stand in: only a recipe of the user's own can). Local sandboxes see
this machine's system directories read-only, so what is checked here is what their
commands find.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import re
import shutil
import subprocess

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CHECK_KINDS = ("command", "library", "locale", "file")
_CHECK = re.compile(r"^(never|(command|library|locale|file):\S.*)$")


class Requirement(BaseModel):
    """One thing a recipe needs that neither uv nor the package index can provide."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    apt: str | None = Field(default=None, description="a system package (SWE-bench installs it with apt-get)")
    conda: str | None = Field(default=None, description="conda-only packages (SWE-bench's conda environment)")
    download: str | None = Field(default=None, description="a download from outside the package index")
    check: list[str] = Field(description="how farm sees it here: command:, library:, locale:, file: or never")

    @field_validator("check", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _valid(self) -> "Requirement":
        named = [k for k in ("apt", "conda", "download") if getattr(self, k)]
        if len(named) != 1:
            raise ValueError("name exactly one of apt, conda, download")
        if not self.check:
            raise ValueError("check: at least one (or 'never')")
        for check in self.check:
            if not _CHECK.match(check):
                raise ValueError(f"check {check!r}: expected never or one of {', '.join(CHECK_KINDS)} as kind:NAME")
        return self

    @property
    def kind(self) -> str:
        return "apt" if self.apt else "conda" if self.conda else "download"

    @property
    def name(self) -> str:
        return self.apt or self.conda or self.download or ""

    def failed_checks(self) -> list[str]:
        """The checks that do not hold on this machine (empty: it is here)."""
        return [c for c in self.check if not check_met(c)]


def unmet(requirements: list[Requirement]) -> list[tuple[str, bool]]:
    """What of ``requirements`` this machine lacks, said for a user, one phrase per kind:
    (phrase, whether installing something here can fix it)."""
    missing = [(r, r.failed_checks()) for r in requirements]
    missing = [(r, failed) for r, failed in missing if failed]
    out: list[tuple[str, bool]] = []
    apt = [(r, failed) for r, failed in missing if r.kind == "apt"]
    if apt:
        names = ", ".join(dict.fromkeys(r.name for r, _ in apt))
        seen = ", ".join(dict.fromkeys(_describe_check(c) for _, failed in apt for c in failed if c != "never"))
        debian = " ".join(dict.fromkeys(r.name.split(" (")[0] for r, _ in apt))
        out.append((f"system packages {names} (apt-get in SWE-bench's spec; {seen or 'not checkable'}; "
                    f"on Debian/Ubuntu: `apt-get install -y {debian}`)",
                    all("never" not in r.check for r, _ in apt)))  # fmt: skip
    for r, _ in missing:
        if r.kind == "conda":
            out.append((f"conda-only packages of {r.name} (SWE-bench's spec builds a conda environment; "
                        "pip cannot install them)", False))  # fmt: skip
        elif r.kind == "download":
            out.append((f"a download of {r.name} (outside the package index)", False))
    return out


def _describe_check(check: str) -> str:
    kind, name = check.split(":", 1)
    return {
        "command": f"no command {name} on PATH",
        "library": f"no library {name} for the dynamic loader",
        "locale": f"no locale {name} in `locale -a`",
        "file": f"no file {name}",
    }[kind]


@functools.lru_cache(maxsize=256)
def check_met(check: str) -> bool:
    """Whether one check holds on this machine (cached: the machine does not change under a load)."""
    if check == "never":
        return False
    kind, name = check.split(":", 1)
    if kind == "command":
        return shutil.which(name) is not None
    if kind == "library":
        return ctypes.util.find_library(name) is not None
    if kind == "locale":
        return _normal_locale(name) in _locales()
    if kind == "file":
        return os.path.exists(name)
    raise ValueError(f"unknown check {check!r}")


def _normal_locale(name: str) -> str:
    # `locale -a` spells en_US.UTF-8 as en_US.utf8: compare without case and dashes.
    return name.lower().replace("-", "")


@functools.lru_cache(maxsize=1)
def _locales() -> frozenset[str]:
    try:
        res = subprocess.run(["locale", "-a"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    return frozenset(_normal_locale(line.strip()) for line in res.stdout.splitlines() if line.strip())
