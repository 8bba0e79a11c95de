"""What determines an environment, and its key.

Two tasks share an environment when the same tree would come out of materializing and
setting up their workspaces: same repository at the same resolved commit (or tarball
content, or image), same pre-patch, same setup commands and setup-time env, same
interpreter, same image/template, the same path inside the sandbox, and the same snapshot
format. The key is a hash of exactly that (``EnvIdentity``); the task id is not part of
it, so tasks that differ only in their instruction or tests share one build.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict

from farm.errors import TaskError
from farm.tasks.model import GitSource, ImageSource, TarballSource, Task
from farm.tasks.runtime import TaskRuntime

SNAPSHOT_FORMAT = 1  # bump when what a snapshot holds, or how it is laid out, changes


class EnvIdentity(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    mount: str  # where the tree lives inside a sandbox (built there, viewed there)
    fields: dict[str, Any]  # what was hashed (kept in the record, shown by `farm envs ls`)


def mount_path(task: Task, mount_root: str) -> str:
    """The task's workdir inside a snapshot-backed sandbox: absolute workdirs as given,
    relative ones under ``mount_root``."""
    if posixpath.isabs(task.workdir):
        return posixpath.normpath(task.workdir)
    return posixpath.normpath(posixpath.join(mount_root, task.workdir))


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


async def _workspace_fields(task: Task, runtime: TaskRuntime) -> dict[str, Any]:
    src = task.workspace
    if isinstance(src, GitSource):
        repo = await runtime.repos.locate(src)
        sha = await runtime.repos.resolve_commit(repo, src.base_commit, src.repo or str(src.url))
        return {"type": "git", "repo": src.repo or src.url, "commit": sha}
    if isinstance(src, TarballSource):
        path = os.path.expanduser(src.path)
        if not os.path.isfile(path):
            raise TaskError(f"task {task.id}: workspace tarball {src.path} not found")
        return {"type": "tarball", "sha256": _sha256_file(path)}
    if isinstance(src, ImageSource):
        return {"type": "image", "image": src.image, "commit": src.base_commit}
    return {"type": "empty"}


async def identity_of(task: Task, runtime: TaskRuntime, *, mount_root: str, backend: str = "local") -> EnvIdentity:
    """The environment ``task`` needs; raises ``TaskError`` when its source cannot be found."""
    python = runtime.python_for(task)
    mount = mount_path(task, mount_root)
    fields = {
        "format": SNAPSHOT_FORMAT,
        "backend": backend,
        "workspace": await _workspace_fields(task, runtime),
        "pre_patch": hashlib.sha256(task.pre_patch.encode()).hexdigest() if task.pre_patch else None,
        "setup_commands": list(task.setup_commands),
        "env": dict(sorted(task.env.items())),
        "python": {"spec": python.spec, "exe": python.exe, "version": python.version},
        "image": task.image,
        "mount": mount,
    }
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return EnvIdentity(key=hashlib.sha256(blob).hexdigest()[:32], mount=mount, fields=fields)
