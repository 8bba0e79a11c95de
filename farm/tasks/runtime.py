"""``TaskRuntime``: what preparing and grading tasks needs on one host, built once from config.

It holds the repository cache (mirrors + fetched repos + workspace tarballs), the
interpreter each task's commands run with (``tasks.python`` or the task's own
``python``: a path, or a version found on this machine) and, when environment
snapshots are on, the snapshot store (``farm.envs``). Build one per process (sandbox
actor, ``farm validate-tasks``, ``farm envs``) with ``TaskRuntime.from_config``.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import RequirementUnmet
from farm.tasks.config import TasksConfig
from farm.tasks.model import ImageSource, Task
from farm.tasks.pycache import warm_once
from farm.tasks.repos import RepoCache

_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")
HOST = ("auto", "host")  # tasks.python values meaning the interpreter running farm (farm.tasks.config)


def python_path_prefix(python: str) -> str | None:
    """The directory to put first on PATH for ``tasks.python`` (None: leave PATH alone)."""
    if python == "none":
        return None
    exe = sys.executable if python in HOST else python
    return os.path.dirname(exe) or None


@dataclass(frozen=True)
class PythonChoice:
    """The interpreter a task's setup, tests and agent find first on PATH."""

    spec: str  # as configured: auto, none, a path or a version
    exe: str | None  # None: PATH left alone
    version: str = ""  # "3.11.7" when known (part of an environment's identity)
    ro_bind: str | None = None  # host prefix a local sandbox must show (a version found on this machine)

    @property
    def path_prefix(self) -> str | None:
        """The interpreter's directory, then uv's (the PyPI package's binary, beside farm's
        own python) when that is elsewhere: setups can say ``uv`` whatever the interpreter."""
        if not self.exe:
            return None
        dirs = [os.path.dirname(self.exe)]
        uv = _uv_dir()
        if uv and uv not in dirs:
            dirs.append(uv)
        return ":".join(dirs)

    def setup_env(self) -> dict[str, str]:
        """Setup commands may use uv (on PATH beside farm's python) with this interpreter,
        never a downloaded one: ``uv venv`` / ``uv pip install`` pick it up. uv trusts the
        system's certificate store (as pip does here through /etc), copies out of its
        cache (the sandbox's cache and workdir are different mounts: no hard links)."""
        if not self.exe:
            return {}
        return {
            "FARM_PYTHON": self.exe, "UV_PYTHON": self.exe, "UV_PYTHON_DOWNLOADS": "never", "UV_LINK_MODE": "copy",
            "UV_SYSTEM_CERTS": "1", "UV_NATIVE_TLS": "1",
        }


@functools.lru_cache(maxsize=1)
def _uv_dir() -> str | None:
    try:
        # optional: uv
        from uv import find_uv_bin

        return os.path.dirname(find_uv_bin())
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        return os.path.dirname(found) if found else None


def _pyenv_roots() -> list[str]:
    roots = [os.environ.get("PYENV_ROOT", ""), os.path.expanduser("~/.pyenv")]
    return [r for r in dict.fromkeys(roots) if r and os.path.isdir(r)]


def find_python(version: str) -> str:
    """An interpreter of ``version`` ("3.9", "3.11.7") on this machine: pyenv's versions
    (newest patch release first), then ``python3.X`` on PATH. RequirementUnmet if none."""
    parts = version.split(".")
    candidates: list[str] = []
    for root in _pyenv_roots():
        found = glob.glob(os.path.join(root, "versions", f"{version}*", "bin", "python"))
        exact = [f for f in found if re.fullmatch(re.escape(version) + r"(\.\d+)*", Path(f).parents[1].name)]
        candidates += sorted(exact, key=lambda f: [int(x) for x in Path(f).parents[1].name.split(".") if x.isdigit()], reverse=True)
    if len(parts) >= 2:
        on_path = shutil.which(f"python{parts[0]}.{parts[1]}")
        if on_path:
            candidates.append(on_path)
    for exe in candidates:
        if _version_of(exe).startswith(version):
            return exe
    raise RequirementUnmet(f"no python {version} on this machine (looked in pyenv {_pyenv_roots()} and PATH)")


@functools.lru_cache(maxsize=64)
def _version_of(exe: str) -> str:
    try:
        res = subprocess.run([exe, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return res.stdout.strip() if res.returncode == 0 else ""


@dataclass
class TaskRuntime:
    config: TasksConfig
    repos: RepoCache
    path_prefix: str | None = None  # tasks.python's (tasks without a python of their own)
    envs: Any = None  # farm.envs.provider.EnvProvider when snapshots are on (set by its owner)
    no_images: str = ""  # why local sandboxes cannot run from container images here (set with envs)
    # the empty patch's grade per task and environment (farm.grading.baseline.BaselineGrades: made there)
    baseline_grades: Any = None
    _pythons: dict[str, PythonChoice] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: TasksConfig) -> "TaskRuntime":
        mirror_dirs: list[str | Path] = []
        if cfg.mirror_dir:
            mirror_dirs.append(cfg.mirror_dir)
        if cfg.path == "demo":
            # the demo task set is built only when asked for
            from farm.tasks.demo import ensure_demo_set

            mirror_dirs.append(ensure_demo_set(cfg.cache_dir).mirror_dir)
        repos = RepoCache(
            cache_dir=cfg.cache_dir, mirror_dirs=mirror_dirs, fetch=cfg.fetch, git_timeout_s=cfg.git_timeout_s,
            workspaces_max_bytes=cfg.workspaces_max_bytes,
        )
        return cls(config=cfg, repos=repos, path_prefix=python_path_prefix(cfg.python))

    def python_for(self, task: Task | None) -> PythonChoice:
        """The task's interpreter (its own ``python``, else ``tasks.python``), resolved once. A
        task in a container image uses the image's (its PATH, activated) unless it names one."""
        image = task is not None and isinstance(task.workspace, ImageSource)
        spec = (task.python if task is not None else None) or ("none" if image else self.config.python)
        if spec not in self._pythons:
            self._pythons[spec] = self._resolve(spec)
        return self._pythons[spec]

    def _resolve(self, spec: str) -> PythonChoice:
        if spec == "none":
            return PythonChoice(spec=spec, exe=None)
        if spec in HOST:
            return PythonChoice(spec=spec, exe=sys.executable, version=_version_of(sys.executable))
        if _VERSION.match(spec):
            exe = find_python(spec)
            prefix = str(Path(exe).resolve().parents[1])
            return PythonChoice(spec=spec, exe=exe, version=_version_of(exe), ro_bind=prefix)
        # An absolute path inside the sandbox (an image's python): its version is the image's.
        return PythonChoice(spec=spec, exe=spec)

    def path_prefix_for(self, task: Task | None) -> str | None:
        return self.python_for(task).path_prefix

    async def sandbox_spec(self, task: Task, spec: Any) -> Any:
        """``spec`` (a SandboxSpec) with what ``task`` needs of a sandbox: its interpreter's
        prefix shown read-only, and its environment snapshot (built first if needed)."""
        update: dict[str, Any] = {}
        if isinstance(task.workspace, ImageSource) and self.envs is None and self.no_images:
            raise RequirementUnmet(f"task {task.id} runs in the image {task.workspace.image}: local sandboxes run images from "
                            f"the environment store, which is off here ({self.no_images})")  # fmt: skip
        python = self.python_for(task)
        await self._warm(python)
        if python.ro_bind and python.ro_bind not in spec.ro_binds:
            update["ro_binds"] = [*spec.ro_binds, python.ro_bind]
        if self.envs is not None and spec.view is None:
            update["view"] = await self.envs.view_for(task)
        return spec.model_copy(update=update) if update else spec

    async def _warm(self, python: PythonChoice) -> None:
        """pytest's plugin caches of a host interpreter written, once (``farm.tasks.pycache``):
        the sandboxes that show it read-only would rewrite every plugin at every run."""
        host = python.spec in HOST or python.ro_bind is not None  # not a path inside an image
        if self.config.warm_pytest_caches and host and python.exe:
            await warm_once(python.exe)
