"""Building one environment: the task's workspace materialized and set up in a sandbox
whose workdir is a plain directory of the build's staging area, then published whole.

The build runs the same code as a rollout without snapshots (``prepare_workspace``:
repository, pre-patch, setup commands with the setup network, the post-setup commit),
at the same path inside the sandbox where every later view of it appears.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Awaitable, Callable

from farm.envs.identity import EnvIdentity
from farm.envs.store import EnvRecord, EnvStore, tree_size
from farm.errors import TaskError
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.sandboxes.views import SnapshotView
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import prepare_workspace

log = logging.getLogger(__name__)

SandboxMaker = Callable[[SandboxSpec], Awaitable[Sandbox]]


def build_spec(task: Task, ident: EnvIdentity, runtime: TaskRuntime, tree: str, labels: dict[str, str]) -> SandboxSpec:
    t = task.timeouts
    python = runtime.python_for(task)
    return SandboxSpec(
        labels={**labels, "task_id": task.id, "purpose": "env-build", "env_key": ident.key},
        image=task.image,
        timeout_s=t.workspace_s + t.setup_s * max(1, len(task.setup_commands)) + 600,
        ro_binds=[python.ro_bind] if python.ro_bind else [],
        view=SnapshotView(key=ident.key, lower=tree, mount=ident.mount, writable=True),
    )


async def build_env(
    task: Task, ident: EnvIdentity, *, runtime: TaskRuntime, store: EnvStore, make_sandbox: SandboxMaker,
    labels: dict[str, str],
) -> EnvRecord:
    """Build and publish ``ident`` (the caller holds its lock). A setup failure or a task
    error (missing repository, bad pre-patch) is published as a failed record; a sandbox
    failure (infrastructure) raises and publishes nothing, so a later rollout tries again."""
    staging = store.staging(ident.key)
    tree = staging / "tree"
    tree.mkdir()
    t0 = time.monotonic()
    common = {"key": ident.key, "mount": ident.mount, "identity": ident.fields, "task_ids": [task.id]}
    try:
        sandbox = await make_sandbox(build_spec(task, ident, runtime, str(tree), labels))
        try:
            try:
                ws = await prepare_workspace(sandbox, task, runtime, raise_on_setup_failure=False)
            except TaskError as exc:
                record = EnvRecord(**common, ok=False, reason=str(exc), build_s=time.monotonic() - t0, built_at=time.time())
            else:
                ok = ws.setup.ok
                record = EnvRecord(
                    **common, ok=ok, reason="" if ok else ws.setup.reason, base_commit=ws.base_commit,
                    baseline_commit=ws.baseline_commit, setup=ws.setup, build_s=time.monotonic() - t0,
                    built_at=time.time(),
                )
        finally:
            await sandbox.close()
        if not record.ok:
            shutil.rmtree(tree, ignore_errors=True)
        else:
            size = await asyncio.to_thread(tree_size, tree)
            record = record.model_copy(update={"size_bytes": size})
        store.publish(staging, record)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info(
        "environment %s for task %s: %s in %.1f s%s", ident.key[:12], task.id, "built" if record.ok else "FAILED",
        record.build_s, "" if record.ok else f": {record.reason}",
    )
    return record
