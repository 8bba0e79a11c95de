"""Applying diffs in a grading sandbox: ``git apply``, then ``git apply --3way``, then
``patch --fuzz``; and putting paths back to their baseline state (before the test patch,
so the model's edits to test files never survive).

Both functions expect the grading layout that ``grader`` sets up: HEAD, index and work
tree all at the workspace baseline (post-setup snapshot).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence

from farm.errors import GradingError
from farm.grading.report import PatchReport, PatchStrategy
from farm.sandboxes.base import Sandbox
from farm.tasks.patches import is_empty, touched_paths
from farm.workspace.shell import CommandReport, git_script, tail

_STRATEGIES: tuple[tuple[PatchStrategy, str], ...] = (
    ("git_apply", "git apply --whitespace=nowarn {p}"),
    ("git_apply_3way", "git apply --3way --whitespace=nowarn {p}"),
    (
        "patch_fuzz",
        "patch --batch --forward --dry-run -p1 --fuzz=3 -i {p} >/dev/null && "
        "patch --batch --forward -p1 --fuzz=3 --no-backup-if-mismatch --reject-file=- -i {p}",
    ),
)


async def restore_paths(sandbox: Sandbox, workdir: str, paths: Sequence[str], *, scratch: str) -> None:
    """Put ``paths`` back to HEAD: tracked ones checked out, the rest deleted; unstaged."""
    if not paths:
        return
    listing = posixpath.join(scratch, "restore.paths")
    await sandbox.write_file(listing, "\0".join(paths) + "\0")
    script = (
        f"while IFS= read -r -d '' p; do\n"
        '  if git cat-file -e "HEAD:$p" 2>/dev/null; then git checkout -q HEAD -- "$p";\n'
        '  else rm -rf -- "$p"; git rm -q --cached --ignore-unmatch -- "$p" >/dev/null 2>&1 || true; fi\n'
        f"done < {shlex.quote(listing)}\n"
        "git reset -q >/dev/null 2>&1 || true\n"
    )
    res = await git_script(sandbox, script, cwd=workdir, timeout=300)
    if res.exit_code != 0:
        raise GradingError(f"cannot restore paths in the grading sandbox: {res.stderr.strip()[-500:]}")


async def apply_patch(
    sandbox: Sandbox,
    workdir: str,
    patch: str,
    *,
    scratch: str,
    name: str = "model.diff",
    timeout: float = 300.0,
    tail_chars: int = 2000,
) -> PatchReport:
    """Apply ``patch`` with the first strategy that works; the tree is restored between
    attempts. ``strategy`` is None in the result when none worked."""
    if is_empty(patch):
        return PatchReport(strategy="empty")
    files = touched_paths(patch)
    path = posixpath.join(scratch, name)
    data = patch if patch.endswith("\n") else patch + "\n"
    await sandbox.write_file(path, data)
    attempts: list[CommandReport] = []
    for strategy, template in _STRATEGIES:
        cmd = template.format(p=shlex.quote(path))
        res = await git_script(sandbox, cmd, cwd=workdir, timeout=timeout)
        attempts.append(
            CommandReport(
                command=strategy,
                exit_code=res.exit_code,
                duration_s=res.duration_s,
                stdout_tail=tail(res.stdout, tail_chars),
                stderr_tail=tail(res.stderr, tail_chars),
            )
        )
        if res.exit_code == 0:
            return PatchReport(strategy=strategy, bytes=len(data.encode()), files=files, attempts=attempts)
        await restore_paths(sandbox, workdir, files, scratch=scratch)
    return PatchReport(strategy=None, bytes=len(data.encode()), files=files, attempts=attempts)
