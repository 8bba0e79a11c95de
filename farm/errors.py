"""Every error farm raises, in one flat hierarchy per boundary.

A failed rollout is data (a status + reason), not a crash: these exceptions are
raised inside a layer and turned into a recorded status at exactly one place (the
rollout pipeline). Each phase has its own timeout type so the status is exact.
"""

from __future__ import annotations

import errno


class FarmError(Exception):
    """Base of every farm error.

    ``deterministic``: this error comes back on every attempt of the same rollout (a
    missing repository or commit, a mirror lacking objects, a machine lacking what the task
    needs, a setup command that exits with an error of its own): running the rollout again
    cannot help, so the retry decision (``farm.rollout.retry``) records it at once. A class
    says it for all of its errors; one error may say it for itself (``SetupCommandFailed``).
    """

    deterministic: bool = False


class ConfigError(FarmError):
    """The run configuration is invalid."""


# --- trajectory -------------------------------------------------------------
class TrajectoryError(FarmError):
    """A turn, tree or Sample violates the trajectory invariants."""


class ShardError(FarmError):
    """A shard or manifest is unreadable or inconsistent."""


class CursorError(FarmError):
    """A saved reader position (``GroupCursor``) is unreadable or no longer matches the
    output directory (its manifest was rewritten since)."""


# --- gateway / engine -------------------------------------------------------
class GatewayError(FarmError):
    """The model gateway could not serve a request."""


class GatewayRequestError(GatewayError):
    """A request the gateway refuses. ``status`` is the HTTP status; ``kind`` is a
    protocol-neutral error kind (invalid_request, authentication, not_found, too_large,
    overloaded, timeout, api_error) that each wire protocol maps to its own error type."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "invalid_request") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


class EngineError(FarmError):
    """The inference engine (SGLang / router) failed."""


class EngineRejected(EngineError):
    """The engine refused the request (HTTP 4xx): not retried."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class EngineTimeout(EngineError):
    """The engine did not answer in time."""


class EngineRetryableError(EngineError):
    """A transport-level failure that is safe to retry (connection reset, 5xx, mid-stream drop)."""


# --- sandboxes / harnesses --------------------------------------------------
class SandboxError(FarmError):
    """A sandbox could not be created, used or closed."""


class SandboxTimeout(SandboxError):
    """A sandbox command exceeded its timeout (its process tree was killed)."""


class SandboxClosed(SandboxError):
    """The sandbox was used after close()."""


class SandboxFileNotFound(SandboxError):
    """read_file: no such file in the sandbox."""


class SandboxAuthError(SandboxError):
    """The sandbox provider rejected the credentials (e.g. a wrong E2B API key)."""


class HarnessError(FarmError):
    """A coding-agent CLI could not be installed, configured or run."""


class HarnessTimeout(HarnessError):
    """The agent exceeded its time budget (its process tree was killed)."""


class HarnessInstallError(HarnessError):
    """A pinned CLI could not be installed into the shared cache or into a sandbox."""


# --- tasks / grading --------------------------------------------------------
class TaskError(FarmError):
    """A task is malformed or its workspace cannot be prepared."""


class TaskLoadError(TaskError):
    """A task file line/row is malformed; names file, line and field."""

    def __init__(self, path: str, line: int, field: str, message: str) -> None:
        self.path, self.line, self.field = path, line, field
        super().__init__(f"{path}:{line}: field {field!r}: {message}")


class TaskFileErrors(TaskLoadError):
    """Rows of a task file are malformed (``tasks.strict``): every one of them, at once, so
    a file is fixed in one pass. ``path``/``line``/``field`` are the first one's."""

    def __init__(self, errors: list[TaskLoadError]) -> None:
        self.errors = list(errors)
        first = self.errors[0]
        self.path, self.line, self.field = first.path, first.line, first.field
        rows = len({e.line for e in self.errors})
        TaskError.__init__(self, f"{first.path}: {len(self.errors)} problem(s) in {rows} row(s):\n"
                                 + "\n".join(f"  {e}" for e in self.errors))  # fmt: skip


class TaskSourceError(TaskError):
    """The task's workspace cannot be made from what it names, on any attempt: its repository
    or base commit is not there, the mirror lacks objects of its tree, its tarball is
    missing, its pre-patch does not apply, its image holds no workspace."""

    deterministic = True


class RepositoryNotFound(TaskSourceError):
    """No mirror, local path or cache holds the task's repository (and it was not fetched)."""


class CommitNotFound(TaskSourceError):
    """The task's repository lacks its base commit."""


class RequirementUnmet(TaskError):
    """This machine lacks what the task's environment needs (a python version, a system
    package): installing it, or a recipe of the user's own, is the fix, not a rerun."""

    deterministic = True


class SetupError(TaskError):
    """A workspace setup command failed."""


class SetupCommandFailed(SetupError):
    """A setup command exited non-zero or timed out; ``report`` is the SetupReport
    (every step's command, exit code, duration and output tails). ``deterministic``: the
    command exited with an error of its own (not a timeout, not killed by a signal), so it
    fails the same way on every attempt."""

    def __init__(self, message: str, report: object = None, *, deterministic: bool = False) -> None:
        super().__init__(message)
        self.report = report
        self.deterministic = deterministic


# a full disk, in the words of the tools that meet it (bash, git, pip, uv's Rust "os error 28")
_DISK_FULL = ("No space left on device", "os error 28", "[Errno 28]")


def says_disk_full(text: str) -> bool:
    """Does this output say the disk filled? The machine's state, not the command's fault."""
    return any(marker in text for marker in _DISK_FULL)


def disk_full(what: str, detail: str) -> OSError:
    """The error for a step that failed because the disk filled: a system error (a later try,
    once there is room, may work), never recorded as the task's own failure."""
    return OSError(errno.ENOSPC, f"No space left on device: {what} (nothing recorded; it runs again once there is room): "
                                 f"{detail[-300:]}")  # fmt: skip


# --- container images (farm.images) -----------------------------------------
class ImageError(FarmError):
    """A container image could not be pulled or unpacked."""


class ImageNotFound(ImageError, TaskError):
    """The registry has no such repository, tag or digest (the task's: not retried)."""

    deterministic = True


class ImageMalformed(ImageError, TaskError):
    """A name, manifest, config or layer that is not a valid image (the task's: not retried)."""

    deterministic = True


class RegistryError(ImageError, SandboxError):
    """The registry refused or could not be reached (infrastructure: a later try may work)."""


class RegistryAuthError(RegistryError):
    """The registry refused the credentials it was given (or wanted some and none were found):
    the same on every attempt of the run (credentials are read when it starts)."""

    deterministic = True


class DigestMismatch(RegistryError):
    """A downloaded blob or manifest is not what its digest says (removed: never unpacked)."""


class GradingError(FarmError):
    """The grader itself failed (not: the model's patch failed the tests)."""


class PatchApplyError(GradingError):
    """The model's diff could not be applied by any strategy."""


# --- trainer integrations ---------------------------------------------------
class IntegrationError(FarmError):
    """A trainer adapter cannot give its trainer what it expects (no groups, wrong group size)."""
