"""Environments on E2B: one template per environment, built with the e2b SDK's template
builder (``AsyncTemplate.build``), then every agent and grading sandbox is created from it.

The template starts from the task's own E2B template (``Task.image``), else the
container image its row names (``metadata.docker_image``: SWE-bench, SWE-Gym,
SWE-smith, R2E-Gym), else E2B's base image; then the workspace (the same per-commit
tarball local sandboxes get, copied in and unpacked at the environment's mount path),
the task's env, each setup command as its own build step (a failing one fails the build
with E2B's reason and log), and last the post-setup commit under ``refs/farm/baseline``
(the rollout reads it back: a template's build cannot return values).

A layered task (``base_setup_commands``, a git workspace) gets two templates, as local
sandboxes get two layers: a **base** template (the repository at its setup commit, the
base setup commands, then every tracked file and the ``.git`` removed: what base setup
created stays), and per instance a template built **from** it (``from_template``): the
instance's checkout unpacked over the base, what is untracked right then (the base's
paths) added to ``.git/info/exclude``, its own setup commands, the post-setup commit.

A build that fails (``BuildException``: a step failed) is recorded once like a local
one; an API or transport failure (auth, 5xx, network) is infrastructure: it raises and
is not recorded, so a later rollout tries again.
"""

from __future__ import annotations

import logging
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from farm.envs.identity import EnvIdentity, setup_commit
from farm.envs.store import EnvRecord, EnvStore
from farm.errors import TaskError, TaskSourceError
from farm.tasks.model import GitSource, ImageSource, TarballSource, Task
from farm.tasks.pycache import repo_compile_script, snapshot_warm_script
from farm.tasks.runtime import TaskRuntime
from farm.workspace.shell import CommandReport, git_env
from farm.workspace.prepare import SetupReport, commit_script

log = logging.getLogger(__name__)

WS_TAR = "farm-workspace.tar"
PRE_PATCH = "farm-pre.patch"

# A base keeps what its setup created: no tracked file (then-empty directories go too), no .git.
_STRIP_TRACKED = (
    "git ls-files -z > /tmp/farm-tracked && xargs -0 -r rm -f -- < /tmp/farm-tracked && "
    "xargs -0 -r -n1 dirname < /tmp/farm-tracked | sort -u | xargs -r rmdir -p --ignore-fail-on-non-empty "
    "2>/dev/null; rm -rf .git /tmp/farm-tracked"
)
# An instance excludes from git what its base put in the workdir (untracked right after unpacking).
_EXCLUDE_BASE = "git ls-files -z --others --directory | tr '\\0' '\\n' | sed 's|^|/|' >> .git/info/exclude"

_INIT = (
    "git init -q -b main 2>/dev/null || git init -q; git add -A && "
    "git commit -q --no-verify --allow-empty -m 'task base'"
)


def template_name(key: str) -> str:
    return f"farm-env-{key[:24]}"


def base_of(task: Task, default: str | None) -> tuple[str, str | None]:
    """("template" | "image" | "base", name)."""
    if task.image:
        return "template", task.image
    image = task.metadata.get("docker_image") if isinstance(task.metadata, dict) else None
    if isinstance(task.workspace, ImageSource):
        image = task.workspace.image
    if image:
        return "image", str(image)
    if default:
        return "template", default
    return "base", None


async def template_for(
    task: Task, ident: EnvIdentity, runtime: TaskRuntime, context: Path, default: str | None, base: EnvRecord | None = None,
) -> Any:
    """The SDK template object for ``task``'s environment (files staged under ``context``):
    a whole one, a base (``ident.is_base``), or an instance from ``base``'s template."""
    # heavy: e2b
    from e2b import AsyncTemplate

    context.mkdir(parents=True, exist_ok=True)
    tpl = AsyncTemplate(file_context_path=str(context))
    if ident.is_base:
        src = task.workspace
        task = task.model_copy(update={"pre_patch": None, "workspace": src.model_copy(
            update={"base_commit": setup_commit(task)}) if isinstance(src, GitSource) else src})  # fmt: skip
    if base is not None and base.template:
        builder = tpl.from_template(base.template)
    else:
        kind, name = base_of(task, default)
        builder = tpl.from_template(name) if kind == "template" else tpl.from_image(name) if kind == "image" else tpl.from_base_image()
    mount = shlex.quote(ident.mount)
    git = " ".join(f"{k}={shlex.quote(v)}" for k, v in git_env().items() if k.startswith(("GIT_AUTHOR", "GIT_COMMITTER")))
    src = task.workspace
    if isinstance(src, (GitSource, TarballSource)):
        tar = await runtime.repos.workspace_tarball(src, task.pre_patch) if isinstance(src, GitSource) else Path(src.path)
        (context / WS_TAR).unlink(missing_ok=True)
        (context / WS_TAR).symlink_to(Path(tar).expanduser().resolve())
        builder = builder.copy(WS_TAR, f"/tmp/{WS_TAR}", resolve_symlinks=True)
        builder = builder.run_cmd(f"mkdir -p {mount} && tar -xf /tmp/{WS_TAR} -C {mount} && rm -f /tmp/{WS_TAR}")
        if isinstance(src, TarballSource):
            builder = builder.run_cmd(f"cd {mount} && (test -e .git || (export {git}; {_INIT}))")
    elif isinstance(src, ImageSource):
        builder = builder.run_cmd(f"cd {mount} && git update-index -q --refresh >/dev/null; true")
        if src.base_commit:
            builder = builder.run_cmd(f"cd {mount} && git checkout -q -f {shlex.quote(src.base_commit)}")
        if task.pre_patch:  # SWE-smith's bug, on the repository its image holds
            (context / PRE_PATCH).write_text(task.pre_patch)
            builder = builder.copy(PRE_PATCH, f"/tmp/{PRE_PATCH}")
            builder = builder.run_cmd(f"cd {mount} && export {git} && git apply --index --whitespace=nowarn "
                                      f"/tmp/{PRE_PATCH} && git commit -q --no-verify -m 'task base' && "
                                      f"rm -f /tmp/{PRE_PATCH}")  # fmt: skip
    else:
        builder = builder.run_cmd(f"mkdir -p {mount} && cd {mount} && export {git} && {_INIT}")
    if task.pre_patch and not isinstance(src, (GitSource, ImageSource)):
        raise TaskSourceError(f"task {task.id}: a pre_patch on a tarball workspace cannot be built into an E2B template")
    builder = builder.set_workdir(ident.mount)
    if task.env:  # (the interpreter is the template's own: tasks.python names host paths)
        builder = builder.set_envs(dict(task.env))
    if ident.is_base:
        commands = task.base_setup_commands
    elif base is not None:
        builder = builder.run_cmd(_EXCLUDE_BASE)
        commands = task.setup_commands
    else:
        commands = [*task.base_setup_commands, *task.setup_commands]
    for command in commands:
        builder = builder.run_cmd(command)
    warm = runtime.config.warm_pytest_caches  # what every sandbox from the template would compile (tasks.pycache)
    if warm and commands:
        builder = builder.run_cmd(_in_bash(snapshot_warm_script()))
    if ident.is_base:
        return builder.run_cmd(_STRIP_TRACKED)
    builder = builder.run_cmd(f"export {git}; {commit_script('/tmp/farm-baseline.index')}")
    return builder.run_cmd(_in_bash(repo_compile_script())) if warm else builder


def _in_bash(script: str) -> str:
    """A build step running ``script`` in bash where the image has one; it never fails (a
    failing step fails the template, and these are best effort)."""
    return f"if command -v bash >/dev/null 2>&1; then bash -c {shlex.quote(script)}; fi; true"


async def build_e2b_env(
    task: Task, ident: EnvIdentity, *, runtime: TaskRuntime, store: EnvStore, api_key: str | None,
    domain: str | None = None, default_template: str | None = None, sdk: Any = None, base: EnvRecord | None = None,
) -> EnvRecord:
    """Build ``ident``'s template (a base's, or with ``base`` an instance's from its
    template) and publish its record (the caller holds the key's lock)."""
    # heavy: e2b
    from e2b.exceptions import BuildException

    if sdk is None:
        from e2b import AsyncTemplate as sdk  # noqa: N813 - the SDK class, injectable for tests
    staging = store.staging(ident.key)
    name = template_name(ident.key)
    logs: list[str] = []
    t0 = time.monotonic()
    common = {"key": ident.key, "mount": ident.mount, "identity": ident.fields, "task_ids": [task.id],
              "backend": "e2b", "template": name, "kind": "base" if ident.is_base else "instance" if base else "env",
              "base_key": base.key if base else ""}  # fmt: skip
    opts: dict[str, Any] = {"api_key": api_key} if api_key else {}
    if domain:
        opts["domain"] = domain
    try:
        try:
            template = await template_for(task, ident, runtime, staging / "context", default_template, base)
            await sdk.build(template, name, on_build_logs=lambda e: logs.append(str(getattr(e, "message", e))), **opts)
        except BuildException as exc:
            step = CommandReport(command=f"e2b template build {name}", exit_code=1, duration_s=time.monotonic() - t0,
                                 stderr_tail="\n".join(logs)[-4000:])  # fmt: skip
            record = EnvRecord(**common, ok=False, reason=f"E2B template build failed: {exc}",
                               setup=SetupReport(ok=False, steps=[step], reason=str(exc)),
                               build_s=time.monotonic() - t0, built_at=time.time())  # fmt: skip
        except TaskError as exc:
            record = EnvRecord(**common, ok=False, reason=str(exc), build_s=time.monotonic() - t0, built_at=time.time())
        else:
            step = CommandReport(command=f"e2b template build {name}", exit_code=0, duration_s=time.monotonic() - t0,
                                 stdout_tail="\n".join(logs)[-4000:])  # fmt: skip
            record = EnvRecord(**common, ok=True, setup=SetupReport(ok=True, steps=[step], duration_s=step.duration_s),
                               build_s=time.monotonic() - t0, built_at=time.time())  # fmt: skip
        shutil.rmtree(staging / "context", ignore_errors=True)
        store.publish(staging, record)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("E2B environment %s (template %s) for task %s: %s", ident.key[:12], name, task.id,
             "built" if record.ok else f"FAILED: {record.reason}")  # fmt: skip
    return record
