"""Applying diffs in a grading sandbox: ``git apply``, then ``git apply --3way``, then
``patch --fuzz``; and putting paths back to their baseline state (before the test patch,
so the model's edits to test files never survive).

Both are steps of the grader's one jailed script (``farm.grading.steps``): ``add_apply`` /
``add_restore`` give it their files (the diff, the list of paths), written in one call
before it runs, and append the steps; ``patch_report`` / ``check_restores`` read their results.

Both expect the grading layout that ``grader`` sets up: HEAD, index and work tree all at
the workspace baseline (post-setup snapshot).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence

from farm.errors import GradingError
from farm.grading.report import PatchReport, PatchStrategy
from farm.grading.steps import StepResults, StepScript
from farm.tasks.patches import is_empty, touched_paths
from farm.workspace.shell import CommandReport, tail

_STRATEGIES: tuple[tuple[PatchStrategy, str], ...] = (
    ("git_apply", "git apply --whitespace=nowarn {p}"),
    ("git_apply_3way", "git apply --3way --whitespace=nowarn {p}"),
    (
        "patch_fuzz",
        "patch --batch --forward --dry-run -p1 --fuzz=3 -i {p} >/dev/null && "
        "patch --batch --forward -p1 --fuzz=3 --no-backup-if-mismatch --reject-file=- -i {p}",
    ),
)
STEP_BUDGET_S = 300.0  # each git step's own limit (the script's is their sum)
RESTORE = "restore"  # the name of a restore step under its prefix: ``<prefix>.restore``


def restore_script(listing: str) -> str:
    """Bash: put the paths in ``listing`` (NUL-separated) back to HEAD: tracked ones checked
    out, the rest deleted; unstaged."""
    return (
        "while IFS= read -r -d '' p; do\n"
        '  if git cat-file -e "HEAD:$p" 2>/dev/null; then git checkout -q HEAD -- "$p";\n'
        '  else rm -rf -- "$p"; git rm -q --cached --ignore-unmatch -- "$p" >/dev/null 2>&1 || true; fi\n'
        f"done < {shlex.quote(listing)}\n"
        "git reset -q >/dev/null 2>&1 || true\n"
    )


def add_restore(script: StepScript, prefix: str, paths: Sequence[str], *, scratch: str) -> None:
    """The listing of ``paths`` (a file of the script) and the step ``<prefix>.restore`` (stops
    the script when it fails: ``check_restores`` says why). Nothing when ``paths`` is empty."""
    if not paths:
        return
    listing = posixpath.join(scratch, f"{prefix}.paths")
    script.file(listing, "\0".join(paths) + "\0")
    script.add(f"{prefix}.{RESTORE}", restore_script(listing), budget_s=STEP_BUDGET_S, then="|| exit 0")


def add_apply(script: StepScript, prefix: str, patch: str, *, scratch: str) -> None:
    """``patch`` (a file of the script) and its strategies as steps ``<prefix>.<strategy>``,
    each after a failed one preceded by a restore of the patch's files (a failed restore stops
    the script); the script stops after the last strategy fails. Nothing for an empty patch."""
    if is_empty(patch):
        return
    path = posixpath.join(scratch, f"{prefix}.diff")
    script.file(path, _text(patch))
    listing = posixpath.join(scratch, f"{prefix}.paths")
    script.file(listing, "\0".join(touched_paths(patch)) + "\0")
    restore = script.step(f"{prefix}.{RESTORE}", restore_script(listing), budget_s=STEP_BUDGET_S, then="|| exit 0")
    script.raw("__ok=0")
    for strategy, template in _STRATEGIES:
        attempt = script.step(f"{prefix}.{strategy}", template.format(p=shlex.quote(path)), budget_s=STEP_BUDGET_S)
        script.raw(f'if [ "$__ok" = 0 ]; then {attempt} && __ok=1 || {{ {restore}; }}; fi')
    script.raw('[ "$__ok" = 1 ] || exit 0')


def patch_report(results: StepResults, prefix: str, patch: str, *, tail_chars: int = 2000) -> PatchReport:
    """What ``add_apply``'s steps did: the strategy that worked (None: none did), every attempt.
    A restore between attempts that failed is a ``GradingError`` (``check_restores``)."""
    if is_empty(patch):
        return PatchReport(strategy="empty")
    check_restores(results, prefix)
    data = _text(patch)
    attempts = [
        CommandReport(command=s.name.removeprefix(prefix + "."), exit_code=s.exit_code, duration_s=s.duration_s,
                      stdout_tail=tail(s.stdout, tail_chars), stderr_tail=tail(s.stderr, tail_chars))
        for s in results.named(prefix) if s.name != f"{prefix}.{RESTORE}"
    ]  # fmt: skip
    if not attempts:
        raise GradingError(f"the grading steps' script never tried to apply {prefix}")
    won = attempts[-1].command if attempts[-1].exit_code == 0 else None
    return PatchReport(strategy=won, bytes=len(data.encode()), files=touched_paths(patch), attempts=attempts)  # type: ignore[arg-type]


def check_restores(results: StepResults, prefix: str) -> None:
    """A failed ``<prefix>.restore`` step is the grader's failure, never the model's."""
    for s in results.named(f"{prefix}.{RESTORE}"):
        if not s.ok:
            raise GradingError(f"cannot restore paths in the grading sandbox: {s.stderr.strip()[-500:]}")


def _text(patch: str) -> str:
    return patch if patch.endswith("\n") else patch + "\n"
