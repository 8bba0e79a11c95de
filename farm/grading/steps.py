"""Several grading steps as one jailed command: each step's exit code, duration and
output kept apart, as if it had run on its own.

Why: every ``sandbox.exec`` of a local sandbox is a bubblewrap start (and an API call on
E2B), and on a CPU-starved node each stretches to a second or more. The grader's work
before the test command (git plumbing, ``git apply``, restores, removals) is a dozen
short commands that run no code of the policy's; run as one bash script they cost one
start instead of one each, and the grader still sees every step's own result.

A ``StepScript`` is bash built from named steps and plain bash control flow (``step``
returns the step's exit code, so ``step a CMD || exit 0`` stops at a failure). Each step
runs in a subshell with its output in files; after it, the script prints a frame with a
random boundary (the steps run farm's commands only, and the boundary is unguessable, so
no output can forge a frame)::

    \\n<boundary> <name> <exit code> <start> <end>\\n<stdout>\\n<boundary>\\n<stderr>

Only the last ``keep_bytes`` of each output cross over (the grader keeps tails anyway); an
empty output costs no ``tail`` (most steps print nothing: a process each saved, in the jail).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from farm.errors import GradingError
from farm.sandboxes.base import Sandbox


@dataclass(frozen=True)
class StepResult:
    """One step of a ``StepScript``, as its own command would have reported it."""

    name: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class StepResults:
    """Every step that ran, in order (a step may run more than once: the restores)."""

    steps: list[StepResult] = field(default_factory=list)

    def named(self, prefix: str) -> Iterator[StepResult]:
        """The steps whose name is ``prefix`` or starts with ``prefix.``, in order."""
        return (s for s in self.steps if s.name == prefix or s.name.startswith(prefix + "."))

    def get(self, name: str) -> StepResult | None:
        return next((s for s in self.steps if s.name == name), None)

    def require(self, name: str) -> StepResult:
        """Step ``name``, which the script always runs: missing, its output was lost."""
        found = self.get(name)
        if found is None:
            raise GradingError(f"the grading steps' script printed no result for step {name!r}")
        return found


# A step's output goes to two files named after the script's boundary (new each script) in
# the sandbox's own /tmp, emptied at the end: no mktemp, no rm (each a process in the jail,
# ~2.5 ms of CPU a rollout each).
_PRELUDE = r"""__O="${TMPDIR:-/tmp}/.$__B.o" __E="${TMPDIR:-/tmp}/.$__B.e"
trap ': >"$__O"; : >"$__E"' EXIT
step() {
  local __t0=${EPOCHREALTIME:-0} __rc
  ( eval "$2" ) >"$__O" 2>"$__E" </dev/null; __rc=$?
  printf '\n%s %s %s %s %s\n' "$__B" "$1" "$__rc" "$__t0" "${EPOCHREALTIME:-0}"
  [ ! -s "$__O" ] || tail -c "$__K" -- "$__O"; printf '\n%s\n' "$__B"; [ ! -s "$__E" ] || tail -c "$__K" -- "$__E"
  return $__rc
}
"""


class StepScript:
    """A bash script of named steps (``step``) and the control flow between them (``raw``)."""

    def __init__(self, *, keep_bytes: int = 16384) -> None:
        self.boundary = "farm-step-" + secrets.token_hex(16)
        self.keep_bytes = keep_bytes
        self.lines: list[str] = []
        self.files: dict[str, str | bytes] = {}  # written from outside before the script runs, in one call
        self.budget_s = 0.0  # the sum of the steps' own time limits: the whole script's

    def step(self, name: str, command: str, *, budget_s: float = 60.0, then: str = "") -> str:
        """The bash that runs ``command`` as step ``name`` (append it with ``raw`` or use
        it in a condition); ``then``: what follows on the same line (``|| exit 0``)."""
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"a step name is one word: {name!r}")
        self.budget_s += budget_s
        return f"step {shlex.quote(name)} {shlex.quote(command)}" + (f" {then}" if then else "")

    def add(self, name: str, command: str, *, budget_s: float = 60.0, then: str = "") -> None:
        self.raw(self.step(name, command, budget_s=budget_s, then=then))

    def raw(self, line: str) -> None:
        self.lines.append(line)

    def file(self, path: str, data: str | bytes) -> None:
        """Have ``path`` (a sandbox path; parents made) hold ``data`` when the script starts."""
        self.files[path] = data

    def text(self) -> str:
        head = f"__B={shlex.quote(self.boundary)}\n__K={int(self.keep_bytes)}\n"
        return head + _PRELUDE + "\n".join(self.lines) + "\nexit 0\n"

    async def run(self, sandbox: Sandbox, *, cwd: str, env: Mapping[str, str] | None = None) -> StepResults:
        """Write its files (``file``), then run the script in ONE ``sandbox.exec``; ``SandboxTimeout`` propagates, and a
        script that did not end its own way (killed, a bash error) is a ``GradingError``."""
        if self.files:
            await sandbox.write_files(self.files)
        res = await sandbox.exec(self.text(), cwd=cwd, env=dict(env or {}), timeout=max(60.0, self.budget_s))
        results = self.parse(res.stdout)
        if res.exit_code != 0:
            last = results.steps[-1].name if results.steps else "(none)"
            why = (res.stderr.strip() or res.stdout.strip())[-500:]
            raise GradingError(f"the grading steps' script exited {res.exit_code} after step {last}: {why}")
        return results

    def parse(self, stdout: str) -> StepResults:
        """The frames in ``stdout`` (text before the first frame is the script's own: none)."""
        marker = "\n" + self.boundary
        pieces = stdout.split(marker)[1:]
        out = StepResults()
        for head_out, err in zip(pieces[0::2], pieces[1::2]):
            head, _, text = head_out.partition("\n")
            name, code, t0, t1 = (head.split() + ["", "", "", ""])[:4]
            try:
                exit_code = int(code)
                duration = max(0.0, _seconds(t1) - _seconds(t0))
            except ValueError:
                raise GradingError(f"the grading steps' script printed a bad frame: {head[:200]!r}") from None
            out.steps.append(StepResult(name=name, exit_code=exit_code, stdout=text, stderr=err.removeprefix("\n"),
                                        duration_s=duration))  # fmt: skip
        return out


def _seconds(stamp: str) -> float:
    """``$EPOCHREALTIME`` (its decimal point follows the locale); 0 where bash lacks it."""
    return float(stamp.replace(",", ".")) if stamp else 0.0
