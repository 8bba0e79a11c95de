"""Workspace preparation inside a sandbox: the repo at its base commit, then setup.

``prepare_workspace(sandbox, task, runtime)``:

1. materializes the workspace at ``Task.workdir``: a git source is uploaded as the
   cached per-commit tarball (see ``farm.tasks.repos``); a tarball is unpacked and
   committed; an image's workdir is checked out at its base commit; no source gives an
   empty git repo. ``TaskError`` when it cannot (missing repo/commit/tarball).
2. runs the setup commands one by one in the workdir (task env, configured python on
   PATH, ``timeouts.setup_s`` each), recording exit code, duration and output tails in
   a ``SetupReport``. The first failure stops: ``SetupCommandFailed`` (carrying the
   report) is raised, which the rollout records as ``setup_failed``.
3. commits the workspace as setup left it (``baseline_commit``, kept reachable under
   ``refs/farm/baseline``). The agent's diff is taken against this snapshot, so files
   setup wrote or changed never show up as the agent's work, and the grader (which
   runs the same setup in its fresh sandbox) applies the diff onto the same state.

A sandbox started from an environment snapshot (``farm.envs``: the result of these three
steps, built once) skips all three: its workspace is the snapshot's, at the path it was
built at, and the build's record gives the commits and the setup report. The build also
writes what each of those sandboxes would compile again (``farm.tasks.pycache``): the
venvs' bytecode and pytest caches after step 2, the repository's bytecode after step 3.

Setup is ``base_setup_commands`` then ``setup_commands``. A layered environment's build
splits them: the base's commands run once in a checkout of the repository-version
(``materialize`` + ``run_setup`` + ``untracked_paths``: what they created is the base),
and each instance is prepared on a view of that base with only its own commands, the
base's paths listed in ``.git/info/exclude`` first (``excludes``) so no baseline or diff
ever holds the venv.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
import shlex
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import SandboxTimeout, SetupCommandFailed, TaskError, TaskSourceError
from farm.sandboxes.base import Sandbox
from farm.tasks.model import GitSource, ImageSource, TarballSource, Task
from farm.tasks.pycache import REPO_COMPILE_LABEL, SNAPSHOT_WARM_LABEL, repo_compile_script, snapshot_warm_script
from farm.tasks.runtime import TaskRuntime
from farm.tasks.venvs import left_out
from farm.workspace.shell import CommandReport, git_script, run_step, stage_script

log = logging.getLogger(__name__)

SCRATCH = ".farm/tasks"  # under the sandbox root; never inside the workdir
BASELINE_REF = "refs/farm/baseline"


class SetupReport(BaseModel):
    """Every setup command that ran, in order; ``ok`` False names the one that failed."""

    model_config = ConfigDict(frozen=True)

    ok: bool = True
    steps: list[CommandReport] = Field(default_factory=list)
    reason: str = ""
    duration_s: float = 0.0
    left_out: list[str] = Field(
        default_factory=list,
        description="what the setup could not install and went on without ('NAME: WHY': a conda-only package)",
    )

    @property
    def failed_for_good(self) -> bool:
        """The step that failed would fail the same way again (``CommandReport.failed_for_good``)."""
        return not self.ok and bool(self.steps) and self.steps[-1].failed_for_good


class Workspace(BaseModel):
    """A prepared workspace in one sandbox."""

    model_config = ConfigDict(frozen=True)

    task_id: str
    workdir: str = Field(description="absolute path inside the sandbox")
    scratch: str = Field(description="farm's scratch dir inside the sandbox (outside workdir)")
    base_commit: str = Field(description="HEAD after materializing (the task's base commit)")
    baseline_commit: str = Field(description="snapshot after setup: diffs are taken against it")
    setup: SetupReport = Field(default_factory=SetupReport)
    timings: dict[str, float] = Field(default_factory=dict)


def workdir_of(sandbox: Sandbox, task: Task) -> str:
    view = sandbox.view  # an environment snapshot's tree (farm.envs): the workdir
    if view is not None and not view.root:  # (a container image's is the whole root: the task says where)
        return view.mount
    return task.workdir if posixpath.isabs(task.workdir) else posixpath.join(sandbox.root, task.workdir)


def task_env(task: Task) -> dict[str, str]:
    return dict(task.env)


async def _checked(sandbox: Sandbox, script: str, *, cwd: str, what: str, timeout: float = 300.0) -> str:
    """Run a git script; a failure is a TaskError naming ``what``. Returns stdout."""
    res = await git_script(sandbox, script, cwd=cwd, timeout=timeout)
    if res.exit_code != 0:
        out = (res.stderr or res.stdout).strip()[-500:]
        raise TaskError(f"{what}: {script.splitlines()[0][:80]!r} failed (exit {res.exit_code}): {out}")
    return res.stdout.strip()


_INIT_AND_COMMIT = (
    "git init -q -b main 2>/dev/null || git init -q; "
    "git config user.name farm && git config user.email farm@localhost && "
    "git add -A && git commit -q --no-verify --allow-empty -m 'task base'"
)


async def materialize(sandbox: Sandbox, task: Task, runtime: TaskRuntime, workdir: str) -> str:
    """Put the workspace in place; returns its HEAD commit."""
    src = task.workspace
    budget = task.timeouts.workspace_s
    parent = posixpath.dirname(workdir.rstrip("/")) or "/"
    what = f"task {task.id}"
    if isinstance(src, GitSource):
        tar = await runtime.repos.workspace_tarball(src, task.pre_patch)
        await _upload(sandbox, str(tar), workdir, budget)
        return await _checked(sandbox, "git rev-parse HEAD", cwd=workdir, what=what)  # pre_patch: done in the tarball
    if isinstance(src, TarballSource):
        if not os.path.isfile(os.path.expanduser(src.path)):
            raise TaskSourceError(f"{what}: workspace tarball {src.path} not found")
        await _upload(sandbox, os.path.expanduser(src.path), workdir, budget)
        res = await sandbox.exec("test -e .git", cwd=workdir, timeout=60)
        if res.exit_code != 0:
            await _checked(sandbox, _INIT_AND_COMMIT, cwd=workdir, what=what)
    elif isinstance(src, ImageSource):
        res = await sandbox.exec(f"test -d {shlex.quote(workdir)}/.git", cwd=parent, timeout=60)
        if res.exit_code != 0:
            exists = await sandbox.exec(f"test -d {shlex.quote(workdir)}", cwd=parent, timeout=60)
            if exists.exit_code != 0:
                raise TaskSourceError(f"{what}: image {src.image} has no workspace at {workdir}")
            await _checked(sandbox, _INIT_AND_COMMIT, cwd=workdir, what=what)
        else:
            # an unpacked image's files have other inodes and times than its git index recorded:
            # refresh it, or `git apply --index` (the pre-patch) finds every file "does not match index"
            await _checked(sandbox, "git update-index -q --refresh >/dev/null; true", cwd=workdir, what=what, timeout=budget)
            if src.base_commit:
                await _checked(sandbox, f"git checkout -q -f {shlex.quote(src.base_commit)}", cwd=workdir, what=what,
                               timeout=budget)  # fmt: skip
    else:
        res = await sandbox.exec(["mkdir", "-p", workdir], timeout=60)
        if res.exit_code != 0:
            raise TaskError(f"{what}: cannot create {workdir}: {res.stderr.strip()}")
        await _checked(sandbox, _INIT_AND_COMMIT, cwd=workdir, what=what)
    if task.pre_patch:
        await sandbox.write_file(posixpath.join(sandbox.root, SCRATCH, "pre.patch"), task.pre_patch)
        await _checked(
            sandbox,
            f"git apply --index --whitespace=nowarn {shlex.quote(posixpath.join(sandbox.root, SCRATCH, 'pre.patch'))} && "
            "git commit -q --no-verify -m 'task base'",
            cwd=workdir,
            what=f"{what}: pre_patch",
        )
    return await _checked(sandbox, "git rev-parse HEAD", cwd=workdir, what=what)


async def _upload(sandbox: Sandbox, local: str, workdir: str, budget: float) -> None:
    try:
        await asyncio.wait_for(sandbox.upload_tarball(local, workdir), budget)
    except TimeoutError:
        raise SandboxTimeout(f"uploading the workspace {local} exceeded {budget:g} s") from None


async def run_setup(
    sandbox: Sandbox, task: Task, runtime: TaskRuntime, workdir: str, commands: Sequence[str] | None = None,
    *, what: str = "setup command",
) -> SetupReport:
    """Run ``commands`` (default: the task's base setup, then its setup) in order,
    stopping at the first failure; in an environment's build, then its venvs' caches."""
    t0 = time.monotonic()
    steps: list[CommandReport] = []
    commands = [*task.base_setup_commands, *task.setup_commands] if commands is None else list(commands)
    for i, command in enumerate(commands):
        step = await run_step(
            sandbox,
            command,
            cwd=workdir,
            timeout=task.timeouts.setup_s,
            env={**runtime.python_for(task).setup_env(), **task_env(task)},
            path_prefix=runtime.path_prefix_for(task),
            tail_chars=runtime.config.output_tail_chars,
        )
        steps.append(step)
        if not step.ok:
            reason = f"{what} {i + 1}/{len(commands)} {step.describe()}"
            return SetupReport(ok=False, steps=steps, reason=reason, duration_s=time.monotonic() - t0,
                               left_out=left_out(s.stdout_tail for s in steps))  # fmt: skip
    view = sandbox.view
    if commands and view is not None and view.building and runtime.config.warm_pytest_caches:
        await _warm_snapshot(sandbox, task, workdir, snapshot_warm_script(), SNAPSHOT_WARM_LABEL, runtime)
    return SetupReport(ok=True, steps=steps, duration_s=time.monotonic() - t0,
                       left_out=left_out(s.stdout_tail for s in steps))  # fmt: skip


async def _warm_snapshot(sandbox: Sandbox, task: Task, workdir: str, script_text: str, label: str,
                         runtime: TaskRuntime) -> None:  # fmt: skip
    """An environment's build: what each later sandbox on it would compile (its venvs'
    bytecode and pytest's plugin caches, the repository's bytecode: ``farm.tasks.pycache``)
    written once, into the snapshot. farm's step, not one of the task's (not in its setup
    report); best effort: a timeout is logged, never an error."""
    step = await run_step(sandbox, script_text, cwd=workdir, timeout=task.timeouts.setup_s, env=task_env(task),
                          path_prefix=runtime.path_prefix_for(task), label=label)  # fmt: skip
    if step.ok:
        log.info("task %s: %s (%s) in %.1f s", task.id, label, " ".join(step.stdout_tail.split()) or "none",
                 step.duration_s)  # fmt: skip
    else:
        log.warning("task %s: %s", task.id, step.describe())


def commit_script(index: str, ref: str = BASELINE_REF) -> str:
    """Bash: commit the workdir's state (a scratch index; HEAD and the real index untouched)
    under ``ref`` and print the commit (HEAD when nothing changed)."""
    index = shlex.quote(index)
    return (
        f"{stage_script(index, 'HEAD')} && tree=$(git write-tree) && "
        'if [ "$tree" = "$(git rev-parse HEAD^{tree})" ]; then c=$(git rev-parse HEAD); '
        "else c=$(git commit-tree \"$tree\" -p HEAD -m 'farm: workspace after setup'); fi && "
        f'git update-ref {ref} "$c" && rm -f {index} && echo "$c"'
    )


async def untracked_paths(sandbox: Sandbox, workdir: str) -> list[str]:
    """What is in the workdir that git does not track, ignored files included, a wholly
    untracked directory as one entry (``dir/``): what a base layer keeps."""
    res = await git_script(sandbox, "git ls-files -z --others --directory", cwd=workdir, timeout=600)
    if res.exit_code != 0 or res.truncated:
        why = "its output was cut (too many paths)" if res.truncated else (res.stderr or res.stdout).strip()[-500:]
        raise TaskError(f"listing what setup created: {why}")
    return [p for p in res.stdout.split("\0") if p]


def _exclude_pattern(path: str) -> str:
    """An anchored .gitignore pattern matching exactly ``path`` (``dir/`` for a directory)."""
    escaped = "".join("\\" + c if c in "*?[\\!#" else c for c in path)
    return "/" + (escaped[:-1] + "\\ " if escaped.endswith(" ") else escaped)


async def exclude(sandbox: Sandbox, workdir: str, paths: Sequence[str]) -> None:
    """Append ``paths`` to the checkout's ``.git/info/exclude``."""
    if not paths:
        return
    lines = "".join(f"{_exclude_pattern(p)}\n" for p in paths)
    script = f"mkdir -p .git/info && printf '%s' {shlex.quote(lines)} >> .git/info/exclude"
    await _checked(sandbox, script, cwd=workdir, what="excluding the base environment from git")


async def snapshot(sandbox: Sandbox, workdir: str, scratch: str, *, ref: str = BASELINE_REF) -> str:
    """Commit the current state of the workdir (untracked files included, ignored ones not)
    without touching HEAD or the index; returns the commit (HEAD when nothing changed)."""
    script = commit_script(posixpath.join(scratch, "snapshot.index"), ref)
    out = await _checked(sandbox, script, cwd=workdir, what="snapshot of the workspace")
    return out.splitlines()[-1].strip()


async def prepare_workspace(
    sandbox: Sandbox, task: Task, runtime: TaskRuntime, *, raise_on_setup_failure: bool = True,
    commands: Sequence[str] | None = None, excludes: Sequence[str] = (), make_scratch: bool = True,
) -> Workspace:
    """Materialize the task's workspace in ``sandbox`` and run its setup (see module doc):
    ``commands`` (default: base setup, then setup), after ``excludes`` (workdir paths a
    base layer under the view holds) are excluded from git.

    Raises ``TaskError`` (workspace cannot be materialized), ``SetupCommandFailed`` (a
    setup command failed or timed out; ``.report`` is the SetupReport) unless
    ``raise_on_setup_failure`` is False (then ``workspace.setup.ok`` is False), and
    ``SandboxError`` from the backend.

    ``make_scratch`` False: on a snapshot view (where nothing here runs a command) the
    scratch directory is left to the caller's first command (the grader's one script: a
    jailed start fewer); elsewhere it is made as always.
    """
    t0 = time.monotonic()
    workdir = workdir_of(sandbox, task)
    scratch = posixpath.join(sandbox.root, SCRATCH)
    view = sandbox.view
    from_snapshot = view is not None and not view.building and runtime.envs is not None
    if make_scratch or not from_snapshot:
        res = await sandbox.exec(["mkdir", "-p", scratch], timeout=60)
        if res.exit_code != 0:
            raise TaskError(f"cannot create {scratch}: {res.stderr.strip()}")
    if from_snapshot:
        # Started from the environment's snapshot: materialized, set up and snapshotted once, at build.
        record = runtime.envs.record(view.key)
        base, baseline = record.base_commit, record.baseline_commit
        if not baseline:  # an E2B template: its build recorded the commits in the repository
            out = await _checked(sandbox, f"git rev-parse HEAD {BASELINE_REF}", cwd=workdir, what=f"task {task.id}")
            base, baseline = out.split()[:2]
        return Workspace(
            task_id=task.id, workdir=workdir, scratch=scratch, base_commit=base,
            baseline_commit=baseline, setup=record.setup,
            timings={"snapshot_view_s": sandbox.view_ready_s, "prepare_s": time.monotonic() - t0},
        )
    base = await materialize(sandbox, task, runtime, workdir)
    await exclude(sandbox, workdir, excludes)
    t1 = time.monotonic()
    setup = await run_setup(sandbox, task, runtime, workdir, commands)
    t2 = time.monotonic()
    if not setup.ok:
        ws = Workspace(task_id=task.id, workdir=workdir, scratch=scratch, base_commit=base, baseline_commit=base, setup=setup)
        if raise_on_setup_failure:
            raise SetupCommandFailed(f"task {task.id}: {setup.reason}", report=setup, deterministic=setup.failed_for_good)
        return ws
    baseline = await snapshot(sandbox, workdir, scratch)
    timings = {"materialize_s": t1 - t0, "setup_s": t2 - t1, "snapshot_s": time.monotonic() - t2}
    if view is not None and view.building and runtime.config.warm_pytest_caches:
        # after the baseline commit: the repository's own bytecode in the snapshot, never in a diff
        await _warm_snapshot(sandbox, task, workdir, repo_compile_script(), REPO_COMPILE_LABEL, runtime)
    return Workspace(
        task_id=task.id, workdir=workdir, scratch=scratch, base_commit=base, baseline_commit=baseline,
        setup=setup, timings=timings,
    )
