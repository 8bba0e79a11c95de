"""Building one environment in a sandbox, then publishing it whole.

Three kinds, each built at the path inside the sandbox where every later view of it
appears (venvs and editable installs hold absolute paths):

- **env** (one layer): the task's workspace materialized and set up (``prepare_workspace``:
  repository, pre-patch, base setup then setup commands, the post-setup commit), in a
  plain directory of the build's staging area bound read-write.
- **base**: a checkout of the repository at the setup commit, the task's
  ``base_setup_commands`` run in it, then only what they created that git does not track
  kept (``layers.keep_untracked``): no tracked file, no ``.git``, no later history.
- **instance**: ``prepare_workspace`` with the task's own ``setup_commands`` on a view of
  its base whose writes land in the staging area (overlay's upper directory, or a copy),
  sealed into a plain layer (``layers.seal_layer``). A task in a container image is an
  instance on the image (``farm.envs.image``): the view is the image's layers at ``/``, with
  the image's environment, and the setup is all of the task's.

A setup failure or a task error (missing repository or commit, a bad pre-patch) is
published as a failed record; a sandbox failure (infrastructure) raises and publishes
nothing, so a later rollout tries again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from farm.envs.identity import EnvIdentity, setup_commit
from farm.envs.layers import keep_untracked, seal_layer
from farm.envs.store import EnvRecord, EnvStore, tree_size
from farm.errors import TaskError, disk_full, says_disk_full
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.sandboxes.views import SnapshotView, ViewLayer
from farm.tasks.model import GitSource, Task
from farm.tasks.repos import IncompleteTree
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import (
    SetupReport, materialize, prepare_workspace, run_setup, untracked_paths, workdir_of,
)

log = logging.getLogger(__name__)

SandboxMaker = Callable[[SandboxSpec], Awaitable[Sandbox]]
_SETUP_COMMIT = "the commit its base environment is built at (the environment_setup_commit)"


def build_spec(
    task: Task, ident: EnvIdentity, runtime: TaskRuntime, view: SnapshotView, labels: dict[str, str],
    commands: Sequence[str],
) -> SandboxSpec:
    t = task.timeouts
    python = runtime.python_for(task)
    return SandboxSpec(
        labels={**labels, "task_id": task.id, "purpose": "env-build", "env_key": ident.key},
        image=task.image,
        timeout_s=t.workspace_s + t.setup_s * max(1, len(commands)) + 600,
        ro_binds=[python.ro_bind] if python.ro_bind else [],
        view=view,
    )


def _unless_disk_full(record: EnvRecord, what: str) -> EnvRecord:
    """The record to publish; a build that failed because the disk filled is none: it raises
    (``farm.errors.disk_full``), so nothing sticks and the next ask builds it again."""
    if not record.ok and (says_disk_full(record.reason) or any(step.disk_full for step in record.setup.steps)):
        raise disk_full(what, record.log_tail() or record.reason)
    return record


def _failed(common: dict, reason: str, t0: float, setup: SetupReport | None = None) -> EnvRecord:
    return EnvRecord(**common, ok=False, reason=reason, setup=setup or SetupReport(), build_s=time.monotonic() - t0,
                     built_at=time.time())  # fmt: skip


async def _publish(store: EnvStore, staging: Path, record: EnvRecord) -> EnvRecord:
    tree = staging / "tree"
    shutil.rmtree(staging / "tree.work", ignore_errors=True)  # overlay's work dir (an instance build)
    if not record.ok:
        shutil.rmtree(tree, ignore_errors=True)
    else:
        record = record.model_copy(update={"size_bytes": await asyncio.to_thread(tree_size, tree)})
    store.publish(staging, record)
    log.info(
        "environment %s (%s) for task %s: %s in %.1f s%s", record.key[:12], record.kind, record.task_ids[0],
        "built" if record.ok else "FAILED", record.build_s, "" if record.ok else f": {record.reason}",
    )
    return record


async def build_env(
    task: Task, ident: EnvIdentity, *, runtime: TaskRuntime, store: EnvStore, make_sandbox: SandboxMaker,
    labels: dict[str, str], base: EnvRecord | None = None,
) -> EnvRecord:
    """Build and publish ``ident`` (the caller holds its lock): one whole environment, or
    with ``base`` (a published, ok base) an instance layer on top of it."""
    staging = store.staging(ident.key)
    tree = staging / "tree"
    tree.mkdir()
    t0 = time.monotonic()
    common = {"key": ident.key, "mount": ident.mount, "identity": ident.fields, "task_ids": [task.id],
              "kind": "instance" if base else "env", "base_key": base.key if base else ""}  # fmt: skip
    if base is None:
        view = SnapshotView(key=ident.key, layers=(ViewLayer(path=str(tree)),), mount=ident.mount, writable=True)
        commands = None
    else:  # on a base (its venv) or a container image (its layers: the whole root)
        view = SnapshotView(key=ident.key, layers=tuple(store.view_layers(base)), mount=ident.mount, upper=str(tree),
                            env=base.env, user=base.user)  # fmt: skip
        commands = task.setup_commands if base.kind == "base" else [*task.base_setup_commands, *task.setup_commands]
    try:
        steps = commands if commands is not None else [*task.base_setup_commands, *task.setup_commands]
        sandbox = await make_sandbox(build_spec(task, ident, runtime, view, labels, steps))
        try:
            mode = getattr(sandbox, "view_mode", "") or "copy"
            try:
                ws = await prepare_workspace(sandbox, task, runtime, raise_on_setup_failure=False, commands=commands,
                                             excludes=base.paths if base else ())  # fmt: skip
            except TaskError as exc:
                record = _failed(common, str(exc), t0)
            else:
                setup = ws.setup
                if base is not None:  # the report shows every step this workspace went through
                    setup = setup.model_copy(update={"steps": [*base.setup.steps, *setup.steps],
                                                     "duration_s": base.setup.duration_s + setup.duration_s,
                                                     "left_out": [*base.setup.left_out, *setup.left_out]})  # fmt: skip
                record = EnvRecord(
                    **common, ok=setup.ok, reason=setup.reason, base_commit=ws.base_commit,
                    baseline_commit=ws.baseline_commit, setup=setup, build_s=time.monotonic() - t0, built_at=time.time(),
                )
        finally:
            await sandbox.close()
        if record.ok and base is not None:
            under = [Path(layer.path) for layer in store.view_layers(base)]
            deleted = await asyncio.to_thread(seal_layer, tree, mode, under)
            record = record.model_copy(update={"deleted": deleted, "build_s": time.monotonic() - t0})
        return await _publish(store, staging, _unless_disk_full(record, f"environment {ident.key[:12]} for task {task.id}"))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


async def build_base(
    task: Task, ident: EnvIdentity, *, runtime: TaskRuntime, store: EnvStore, make_sandbox: SandboxMaker,
    labels: dict[str, str],
) -> EnvRecord:
    """Build and publish the base ``ident`` of ``task`` (the caller holds its lock): its
    base setup commands in a checkout at the setup commit, then only what they created."""
    staging = store.staging(ident.key)
    checkout, tree = staging / "checkout", staging / "tree"
    checkout.mkdir()
    tree.mkdir()
    t0 = time.monotonic()
    common = {"key": ident.key, "mount": ident.mount, "identity": ident.fields, "task_ids": [task.id], "kind": "base"}
    src = task.workspace
    at = task.model_copy(update={
        "workspace": src.model_copy(update={"base_commit": setup_commit(task)}) if isinstance(src, GitSource) else src,
        "pre_patch": None})  # fmt: skip
    view = SnapshotView(key=ident.key, layers=(ViewLayer(path=str(checkout)),), mount=ident.mount, writable=True)
    try:
        sandbox = await make_sandbox(build_spec(task, ident, runtime, view, labels, task.base_setup_commands))
        paths: list[str] = []
        try:
            try:
                workdir = workdir_of(sandbox, at)
                head = await materialize(sandbox, at, runtime, workdir)
                setup = await run_setup(sandbox, at, runtime, workdir, at.base_setup_commands, what="base setup command")
                if setup.ok:
                    paths = await untracked_paths(sandbox, workdir)
            except IncompleteTree as exc:  # say which commit it is: not the row's own
                record = _failed(common, exc.describe(_SETUP_COMMIT), t0)
            except TaskError as exc:
                record = _failed(common, str(exc), t0)
            else:
                record = EnvRecord(**common, ok=setup.ok, reason=setup.reason, base_commit=head, setup=setup, paths=paths,
                                   build_s=time.monotonic() - t0, built_at=time.time())  # fmt: skip
        finally:
            await sandbox.close()
        if record.ok:
            try:
                await asyncio.to_thread(keep_untracked, checkout, paths, tree)
            except (TaskError, OSError) as exc:
                record = _failed(common, f"keeping what base setup created: {exc}", t0, record.setup)
        shutil.rmtree(checkout, ignore_errors=True)
        if record.ok and not paths:
            log.warning("base environment %s for task %s: its setup created nothing in the workdir (it must install "
                        "there, e.g. a venv in the workdir)", ident.key[:12], task.id)  # fmt: skip
        record = _unless_disk_full(record, f"base environment {ident.key[:12]} for task {task.id}")
        return await _publish(store, staging, record.model_copy(update={"build_s": time.monotonic() - t0}))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
