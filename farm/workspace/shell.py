"""Running task commands in a sandbox and recording them (``CommandReport``).

Every command farm runs for a task (setup, tests, verifiers, git plumbing) goes through
``run_step``: one bash script, in the workspace, with the task's env and the configured
python first on PATH, a timeout, and its exit code / duration / output tails kept.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from farm.errors import SandboxTimeout, says_disk_full
from farm.sandboxes.base import ExecResult, Sandbox
from farm.tasks.repos import GIT_IDENTITY  # noqa: F401 - re-exported: one identity for host and sandbox git

# Fixed identity and dates: commits farm makes (task base, setup baseline) are
# reproducible, so the same workspace gets the same commit ids in every sandbox.


def tail(text: str, chars: int) -> str:
    if chars <= 0:
        return ""
    return text if len(text) <= chars else "..." + text[-chars:]


class CommandReport(BaseModel):
    """One command: what ran, how it ended, how long it took, the ends of its output."""

    model_config = ConfigDict(frozen=True)

    command: str
    exit_code: int | None = None  # None: timed out (its process tree was killed)
    timed_out: bool = False
    duration_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def failed_for_good(self) -> bool:
        """It ended with an error of its own (an exit status below 128): the same command
        fails the same way again. Not a timeout, nor a kill by a signal (128 + its number,
        e.g. a memory limit's SIGKILL), which a machine under load or short of memory causes;
        nor an error because the disk filled (``disk_full``)."""
        return not self.timed_out and self.exit_code is not None and 0 < self.exit_code < 128 and not self.disk_full

    @property
    def disk_full(self) -> bool:
        """It failed, and its output says the disk filled (the machine's state, not the command's)."""
        return not self.ok and says_disk_full(self.stdout_tail + self.stderr_tail)

    def describe(self) -> str:
        cmd = self.command if len(self.command) <= 120 else self.command[:117] + "..."
        if self.timed_out:
            return f"{cmd!r} timed out after {self.duration_s:.0f} s"
        out = (self.stderr_tail.strip() or self.stdout_tail.strip())[-300:]
        return f"{cmd!r} exited {self.exit_code}" + (f": {out}" if out else "")


def script(command: str, *, path_prefix: str | None = None) -> str:
    """The bash script for a task command: optional PATH prefix, then the command as written."""
    if path_prefix:
        return f"export PATH={shlex.quote(path_prefix)}:\"$PATH\"\n{command}"
    return command


async def run_command(
    sandbox: Sandbox,
    command: str,
    *,
    cwd: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    path_prefix: str | None = None,
    tail_chars: int = 4000,
    label: str | None = None,
) -> tuple[CommandReport, ExecResult | None]:
    """Run ``command`` to completion: (its report, the full result; None when it timed out).

    A timeout is a result (``timed_out``), not an exception; ``SandboxError`` (backend
    failure, closed sandbox) propagates.
    """
    try:
        res: ExecResult = await sandbox.exec(
            script(command, path_prefix=path_prefix), cwd=cwd, env=dict(env or {}), timeout=timeout
        )
    except SandboxTimeout:
        return CommandReport(command=label or command, timed_out=True, duration_s=timeout), None
    report = CommandReport(
        command=label or command,
        exit_code=res.exit_code,
        duration_s=res.duration_s,
        stdout_tail=tail(res.stdout, tail_chars),
        stderr_tail=tail(res.stderr, tail_chars),
    )
    return report, res


async def run_step(
    sandbox: Sandbox,
    command: str,
    *,
    cwd: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    path_prefix: str | None = None,
    tail_chars: int = 4000,
    label: str | None = None,
) -> CommandReport:
    """``run_command`` keeping only the report."""
    report, _ = await run_command(
        sandbox, command, cwd=cwd, timeout=timeout, env=env, path_prefix=path_prefix, tail_chars=tail_chars, label=label
    )
    return report


_GIT_CONFIG = {
    "safe.directory": "*",  # uploaded files may belong to another uid than the sandbox user
    "core.hooksPath": "/dev/null",  # never run hooks a task (or an agent) left in the repo
    "advice.detachedHead": "false",
    "core.quotepath": "off",
    "core.autocrlf": "false",
    "commit.gpgsign": "false",
}


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Env for farm's own git plumbing: fixed identity, safe config (GIT_CONFIG_COUNT)."""
    env = {**GIT_IDENTITY, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_COUNT": str(len(_GIT_CONFIG))}
    for i, (key, value) in enumerate(_GIT_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    env.update(extra or {})
    return env


# For farm's own `git add -A` over a scratch index seeded from the repo's own one: compare
# a file's size and whole-second mtime only. The repo arrives from a tarball or an
# environment snapshot (another inode, ctime and owner than when its index was written), so
# git's default check would call every file changed and hash them all. A file changed in
# the same second as the index was written is "racily clean" and git compares its content;
# a git built with nanosecond stamps would call it racy only from the index's nanosecond
# on, so ``stage_script`` cuts the seed's mtime to its whole second.
_STAT_CHECK = "-c core.checkStat=minimal -c core.trustctime=false"


def stage_script(index: str, tree: str, pathspecs: str = ".") -> str:
    """Bash: stage the workdir (``git add -A -- pathspecs``) into ``index`` (a scratch
    index: an absolute path, shell-quoted) over exactly ``tree``, then export
    ``GIT_INDEX_FILE={index}`` for what follows (diff, write-tree). Run with the workdir as
    cwd and ``GIT_INDEX_FILE`` not yet set.

    The scratch index starts from the repo's own index (``git read-tree -m`` keeps the stat
    data of its entries that match ``tree``), so ``git add -A`` hashes only the files that
    changed since, not every file of the repository: 0.67 s -> 0.09 s on 6,800 files
    (``scripts/bench_capture.py``). Whoever had the repo (setup, the agent) may have left
    its index in any state: none, a merge in progress, entries flagged assume-unchanged or
    skip-worktree (``git add`` would skip those files and hide their changes). Any of
    these: ``tree`` alone, every file hashed, as before."""
    git = f"GIT_INDEX_FILE={index} git {_STAT_CHECK}"
    # a plain checkout's index is .git/index: asked of git (a process) only for a worktree or
    # a gitfile; the scratch index is there only when this ran before (rm is a process too)
    return (
        "if [ -d .git ]; then own=.git/index; else own=$(git rev-parse --git-path index 2>/dev/null) || own=; fi; "
        f"[ ! -e {index} ] || rm -f {index}; "
        f'{{ [ -n "$own" ] && cp -p -- "$own" {index} 2>/dev/null && '
        f'touch -d "@$(stat -c %Y {index})" {index} && '
        f"{git} read-tree -m {tree} 2>/dev/null && ! {git} ls-files -v | grep -q '^[[:lower:]S]'; }} || "
        f"{{ rm -f {index} && {git} read-tree {tree}; }} && "
        f"{git} add -A -- {pathspecs} && export GIT_INDEX_FILE={index}"
    )


async def git_script(
    sandbox: Sandbox, script_text: str, *, cwd: str, timeout: float = 300.0, env: Mapping[str, str] | None = None
) -> ExecResult:
    """A bash script of git plumbing with ``git_env``. Exit codes are for the caller;
    SandboxTimeout propagates."""
    return await sandbox.exec(script_text, cwd=cwd, env=git_env(env), timeout=timeout)
