"""After the agent: the diff of its work, against the workspace as setup left it.

``capture_diff(sandbox, workspace, exclude=[...])`` stages the whole workdir into a
scratch index (``GIT_INDEX_FILE``; the repo's own index, HEAD and branches are not
touched, so commits, resets or branch switches by the agent do not matter: the working
tree is what counts) and diffs it against ``workspace.baseline_commit``. New files are
included, ignored files (``.gitignore``) are not, nor caches that tests and tools leave
(``farm.tasks.patches.CACHE_GLOBS``: ``__pycache__``, ``.pytest_cache``, ...: a repository
without a ``.gitignore`` would otherwise hand them over as the agent's work), and
``exclude`` removes the files farm itself wrote (harness config, instructions files): git
pathspec globs relative to the workdir, e.g. ``CLAUDE.md``, ``.claude/**``, ``**/AGENTS.md``. The diff is binary-safe
(``--binary``), rename-free (``patch`` understands it too), and capped at ``max_bytes``.
"""

from __future__ import annotations

import posixpath
import shlex
import time
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import PatchApplyError, SandboxTimeout
from farm.sandboxes.base import Sandbox
from farm.tasks.patches import CACHE_GLOBS, touched_paths
from farm.workspace.shell import git_script, stage_script
from farm.workspace.prepare import Workspace

_DIFF_OPTS = "--binary --no-color --no-ext-diff --no-textconv --no-renames --src-prefix=a/ --dst-prefix=b/"


class CapturedDiff(BaseModel):
    """The agent's work as a diff (``patch`` is empty when it changed nothing)."""

    model_config = ConfigDict(frozen=True)

    patch: str = ""
    bytes: int = 0
    files: list[str] = Field(default_factory=list)
    too_large: bool = Field(default=False, description="over max_bytes: patch holds only the head; graded patch_failed")
    duration_s: float = 0.0

    @property
    def empty(self) -> bool:
        return not self.patch.strip()


def exclude_pathspecs(patterns: Sequence[str]) -> list[str]:
    return [f":(exclude,glob){p}" for p in patterns if p]


async def capture_diff(
    sandbox: Sandbox,
    workspace: Workspace,
    *,
    exclude: Sequence[str] = (),
    max_bytes: int = 4 << 20,
    timeout: float = 300.0,
) -> CapturedDiff:
    """The diff of the workdir against the post-setup baseline (see module doc).

    Raises ``PatchApplyError`` when no diff can be taken (the agent destroyed the repo:
    graded as patch_failed), ``SandboxError`` from the backend.
    """
    t0 = time.monotonic()
    scratch = workspace.scratch
    index = shlex.quote(posixpath.join(scratch, "capture.index"))
    out = shlex.quote(posixpath.join(scratch, "model.diff"))
    specs = " ".join(shlex.quote(s) for s in [".", *exclude_pathspecs([*CACHE_GLOBS, *exclude])])
    base = shlex.quote(workspace.baseline_commit)
    # the scratch dir is made here when the rollout left it to this command (a snapshot's
    # workspace runs none before it: ``prepare_workspace(make_scratch=False)``), a jail's start fewer
    made = f"[ -d {shlex.quote(scratch)} ] || mkdir -p -- {shlex.quote(scratch)}"
    # stdout: the diff's size in bytes, NUL, then, for a diff over ``max_bytes`` only, the
    # changed paths, NUL-separated (the size in the same jailed command: a sandbox exec
    # fewer). A diff within the limit is read whole, and its paths are its headers' (one
    # git process fewer: with --no-renames each header names one path, git-quoted).
    script = (
        f"set -e\n{made}\n{stage_script(index, base, specs)}\n"
        f"git diff --cached {_DIFF_OPTS} {base} > {out}\n"
        f"size=$(stat -c %s {out}); printf '%s\\0' \"$size\"\n"
        f"[ \"$size\" -le {int(max_bytes)} ] || git diff --cached --name-only --no-renames -z {base}\n"
    )
    try:
        res = await git_script(sandbox, script, cwd=workspace.workdir, timeout=timeout)
    except SandboxTimeout:
        raise PatchApplyError(f"capturing the diff exceeded {timeout:g} s") from None
    if res.exit_code != 0:
        raise PatchApplyError(f"cannot capture the diff (exit {res.exit_code}): {res.stderr.strip()[-500:]}")
    size_field, _, names = res.stdout.partition("\0")
    if not size_field.strip().isdigit():
        raise PatchApplyError(f"cannot capture the diff: unexpected output {res.stdout[:200]!r}")
    size = int(size_field)
    if size > max_bytes:  # (git's list of paths came only for this case)
        head = await sandbox.exec(["head", "-c", str(min(max_bytes, 64 << 10)), posixpath.join(scratch, "model.diff")], timeout=60)
        files = [f for f in names.split("\0") if f]
        return CapturedDiff(
            patch=head.stdout, bytes=size, files=files, too_large=True, duration_s=time.monotonic() - t0
        )
    data = await sandbox.read_file(posixpath.join(scratch, "model.diff"))
    patch = data.decode("utf-8", errors="replace")
    return CapturedDiff(patch=patch, bytes=size, files=touched_paths(patch), duration_s=time.monotonic() - t0)
