"""What determines an environment, and its key.

Two tasks share an environment when the same tree would come out of materializing and
setting up their workspaces: same repository at the same resolved commit (or tarball
content, or image), same pre-patch, same setup commands and setup-time env, same
interpreter, same image/template, the same path inside the sandbox, and the same snapshot
format. The key is a hash of exactly that (``EnvIdentity``); the task id is not part of
it, so tasks that differ only in their instruction or tests share one build.

A task with ``base_setup_commands`` (local sandboxes) has two layers. Its **base** is
one per repository, ``environment_setup_commit`` (else ``version``, else the base
commit), base setup commands, env, interpreter, image, backend, mount and format: not
the instance's base commit, pre-patch or per-instance setup, so every instance of a
repository-version shares it. Its **instance** identity is the one-layer identity above
(setup commands: the per-instance ones) plus the base's key.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from typing import Any

from pydantic import BaseModel, ConfigDict

from farm.errors import TaskSourceError
from farm.tasks.model import GitSource, ImageSource, TarballSource, Task
from farm.tasks.runtime import TaskRuntime

SNAPSHOT_FORMAT = 1  # bump when what a snapshot holds, or how it is laid out, changes


class EnvIdentity(BaseModel):
    model_config = ConfigDict(frozen=True)

    key: str
    mount: str  # where the tree lives inside a sandbox (built there, viewed there)
    fields: dict[str, Any]  # what was hashed (kept in the record, shown by `farm envs ls`)
    base: EnvIdentity | None = None  # a layered environment: the base it stacks on

    @property
    def is_base(self) -> bool:
        return self.fields.get("layer") == "base"

    @property
    def is_image(self) -> bool:
        return self.fields.get("layer") == "image"


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
            raise TaskSourceError(f"task {task.id}: workspace tarball {src.path} not found")
        return {"type": "tarball", "sha256": _sha256_file(path)}
    if isinstance(src, ImageSource):
        return {"type": "image", "image": src.image, "commit": src.base_commit}
    return {"type": "empty"}


def setup_commit(task: Task) -> str:
    """The commit a layered task's base is built at: the row's ``environment_setup_commit``,
    else the task's base commit."""
    env_commit = task.metadata.get("environment_setup_commit") if isinstance(task.metadata, dict) else None
    src = task.workspace
    return str(env_commit) if env_commit else src.base_commit if isinstance(src, GitSource) else ""


async def _base_workspace_fields(task: Task, runtime: TaskRuntime, instance: dict[str, Any]) -> dict[str, Any]:
    src = task.workspace
    if not isinstance(src, GitSource):
        return instance  # a tarball, an image, an empty dir: the base is built on the same
    version = task.metadata.get("version") if isinstance(task.metadata, dict) else None
    if task.metadata.get("environment_setup_commit") or version in (None, ""):
        repo = await runtime.repos.locate(src)
        what = f"{src.repo or src.url} (environment_setup_commit)"
        return {"type": "git", "repo": src.repo or src.url,
                "setup_commit": await runtime.repos.resolve_commit(repo, setup_commit(task), what)}  # fmt: skip
    return {"type": "git", "repo": src.repo or src.url, "version": str(version)}


def _hashed(fields: dict[str, Any], mount: str, base: EnvIdentity | None = None, key_prefix: str = "") -> EnvIdentity:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    key = key_prefix + hashlib.sha256(blob).hexdigest()[: 32 - len(key_prefix)]
    return EnvIdentity(key=key, mount=mount, fields=fields, base=base)


def image_identity(digest: str, activate: str | None, platform: str, backend: str) -> EnvIdentity:
    """A container image as the base of its tasks' environments (``farm.envs.image``)."""
    fields = {"format": SNAPSHOT_FORMAT, "layer": "image", "backend": backend, "digest": digest, "activate": activate,
              "platform": platform}  # fmt: skip
    return _hashed(fields, "/", key_prefix="i")


async def identity_of(
    task: Task, runtime: TaskRuntime, *, mount_root: str, backend: str = "local", layered: bool = True,
    image: EnvIdentity | None = None,
) -> EnvIdentity:
    """The environment ``task`` needs; raises ``TaskError`` when its source cannot be found.
    With ``base_setup_commands`` and ``layered`` (local sandboxes): an instance on a base
    (``.base``); otherwise one layer whose setup is the base's commands then the task's.
    With ``image`` (a container image's identity, ``image_identity``: local sandboxes run
    from the image as their root): an instance on the image, at ``/``."""
    python = runtime.python_for(task)
    mount = "/" if image is not None else mount_path(task, mount_root)
    workspace = await _workspace_fields(task, runtime)
    if image is not None:
        workspace = {**workspace, "digest": image.fields["digest"]}
    shared = {
        "format": SNAPSHOT_FORMAT,
        "backend": backend,
        "env": dict(sorted(task.env.items())),
        "python": {"spec": python.spec, "exe": python.exe, "version": python.version},
        "image": task.image,
        "mount": mount,
    }
    base = image
    setup = [*task.base_setup_commands, *task.setup_commands]
    if task.base_setup_commands and layered and image is None:
        base_fields = {**shared, "layer": "base", "workspace": await _base_workspace_fields(task, runtime, workspace),
                       "base_setup_commands": list(task.base_setup_commands)}  # fmt: skip
        base = _hashed(base_fields, mount)
        setup = list(task.setup_commands)
    fields = {
        **shared,
        "workspace": workspace,
        "pre_patch": hashlib.sha256(task.pre_patch.encode()).hexdigest() if task.pre_patch else None,
        "setup_commands": setup,
    }
    if base is not None:
        fields["base"] = base.key
    return _hashed(fields, mount, base)
