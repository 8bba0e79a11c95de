"""The data of one harness run: what a rollout asks (``HarnessRun``), the configured CLI
ready to start (``LaunchPlan``), how it ended (``HarnessResult``), and what the runner
needs of a harness (``HarnessHooks``). Shared by ``base`` (the harnesses) and ``runner``
(which starts and supervises the CLI), so neither imports the other's module for them.
"""

from __future__ import annotations

import os
import shlex
from enum import Enum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field


class HarnessEnd(str, Enum):
    """How the CLI's run ended, as farm saw it: a fact; ``farm.rollout.outcome`` says what
    it makes of the rollout."""

    FINISHED = "finished"  # exited 0, no error in its stream
    ERROR_REPORTED = "error_reported"  # exited 0, but its stream reported an error
    EXITED = "exited"  # a non-zero exit, or killed by a signal
    TIMED_OUT = "timed_out"  # its budget ran out: the process tree was killed
    MODEL_PATH_LOST = "model_path_lost"  # the watchdog killed it: stuck retrying model requests, or the gateway gone
    GATEWAY_UNREACHABLE = "gateway_unreachable"  # the gateway unreachable from the sandbox: never started
    IDLE = "idle"  # farm's idle watch killed it: no model request in flight, no tool running


class HarnessRun(BaseModel):
    """What one rollout asks of the CLI."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instruction: str = Field(min_length=1, description="the task text, sent to the CLI verbatim")
    gateway_url: str = Field(description="gateway root URL as seen from inside the sandbox (no /v1)")
    api_key: str = Field(min_length=1, description="the rollout's gateway session secret")
    model: str = Field(min_length=1, description="the policy's model name (every alias maps to it)")
    workdir: str = Field(description="absolute path of the task's working directory in the sandbox")
    budget_s: float = Field(gt=0, description="wall-clock budget for the CLI; then its process tree is killed")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="task env for the CLI and its tools (e.g. PATH with the task's python); the CLI's own "
        "settings and harness.extra_env win over it",
    )


class LaunchPlan(BaseModel):
    """A configured, ready-to-start CLI. ``env`` holds the secret: never log it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    harness: str
    binary: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    scratch_dir: str
    stdin_path: str
    stdout_path: str
    stderr_path: str
    files_written: list[str] = Field(description="absolute sandbox paths farm wrote for this run")
    gateway_url: str
    budget_s: float

    def shell_command(self) -> str:
        """The command line, for logs (no secrets: those are in env only)."""
        return f"{shlex.join(self.argv)} < {shlex.quote(self.stdin_path)}"


class HarnessResult(BaseModel):
    """How the CLI ended, and what it printed."""

    model_config = ConfigDict(extra="forbid")

    harness: str
    end: HarnessEnd = Field(description="how the CLI ended (the rollout's status is farm.rollout.outcome's)")
    reason: str = ""
    exit_code: int | None = Field(default=None, description="None when farm killed it; negative: killed by signal")
    timed_out: bool = False
    events: list[dict[str, Any]] = Field(default_factory=list, description="the CLI's JSON event stream, parsed")
    non_json_lines: int = 0
    final_message: str | None = Field(default=None, description="the agent's last text answer, if it gave one")
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout: str = Field(default="", exclude=True, description="the CLI's whole stdout (its event stream): artifacts")
    stderr: str = Field(default="", exclude=True, description="the CLI's whole stderr: artifacts")
    duration_s: float = 0.0
    command: str = ""
    files_written: list[str] = Field(default_factory=list, description="absolute sandbox paths farm wrote")
    diff_excludes: list[str] = Field(
        default_factory=list, description="files_written inside the workdir, relative to it (exclude from the diff)"
    )

    @property
    def ok(self) -> bool:
        return self.end is HarnessEnd.FINISHED


def diff_excludes(files: list[str], workdir: str) -> list[str]:
    root = os.path.normpath(workdir)
    out = []
    for f in files:
        p = os.path.normpath(f)
        if p.startswith(root + os.sep):
            out.append(os.path.relpath(p, root))
    return out


class HarnessHooks(Protocol):
    """What ``runner.run_plan`` uses of a harness (``base.Harness`` implements it)."""

    name: str
    config: Any

    def final_message(self, events: list[dict[str, Any]]) -> str | None: ...

    def stream_error(self, events: list[dict[str, Any]]) -> str | None: ...

    def retry_loop(self, events: list[dict[str, Any]]) -> str | None: ...
