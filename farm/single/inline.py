"""Inline tasks: a task given whole in the request (instruction, files, setup commands,
a verifier script that writes a reward), as OpenEnv environments take a ``test_script``.

It becomes an ordinary generic ``farm.tasks.model.Task``, so it goes through the same
workspace preparation and grader as any task file row:

- ``files`` are packed into a tarball on the host (``TarballSource``: unpacked and
  committed as the task's base, so the diff is the agent's work only);
- the verifier script is NOT in the workspace (the agent could read or edit it): the
  grader writes it to a temp file outside the workdir and runs it after the agent's
  diff is applied; it writes a float to ``$FARM_REWARD_FILE`` (else its exit code
  decides: 0 -> 1.0, else 0.0).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from farm.errors import TaskError
from farm.tasks.model import Task, TaskTimeouts, TarballSource

REWARD_FILE = ".farm_reward"


class InlineTask(BaseModel):
    """What a caller sends for a task that is in no task file."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="default: 'inline-' + a digest of the content")
    instruction: str = Field(min_length=1)
    files: dict[str, str] = Field(default_factory=dict, description="workspace-relative path -> text content")
    setup: list[str] = Field(default_factory=list, description="setup commands, run in the workspace")
    verifier: str = Field(min_length=1, description="bash script; writes a float to $FARM_REWARD_FILE")
    agent_timeout_s: float = Field(default=600.0, gt=0)
    test_timeout_s: float = Field(default=300.0, gt=0)

    @field_validator("files")
    @classmethod
    def _relative(cls, files: dict[str, str]) -> dict[str, str]:
        for name in files:
            p = PurePosixPath(name)
            if not name or p.is_absolute() or ".." in p.parts or name.startswith(".git/") or name == ".git":
                raise ValueError(f"file path must be relative, inside the workspace and not .git: {name!r}")
        return files

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


def _tarball(files: dict[str, str], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for name, content in sorted(files.items()):
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(path)


def _verify_command(script: str) -> str:
    """The verifier, written outside the workdir at grading time and run from the workdir."""
    b64 = base64.b64encode(script.encode()).decode()
    return (f'v=$(mktemp /tmp/farm-verify.XXXXXX) && echo {b64} | base64 -d > "$v" && '
            f'bash "$v"; rc=$?; rm -f "$v"; '
            f'[ -s "$FARM_REWARD_FILE" ] || '
            f'{{ [ $rc -eq 0 ] && echo 1 > "$FARM_REWARD_FILE" || echo 0 > "$FARM_REWARD_FILE"; }}; '
            f'exit $rc')  # fmt: skip


def to_task(inline: InlineTask | dict[str, Any], work_dir: Path) -> Task:
    """The inline task as a farm Task; its files' tarball goes under ``work_dir``."""
    try:
        spec = inline if isinstance(inline, InlineTask) else InlineTask.model_validate(inline)
    except ValueError as exc:
        raise TaskError(f"bad inline task: {exc}") from exc
    task_id = spec.id or f"inline-{spec.digest()}"
    workspace = None
    if spec.files:
        tar = work_dir / "inline" / f"{task_id}-{spec.digest()}.tar.gz"
        if not tar.exists():
            _tarball(spec.files, tar)
        workspace = TarballSource(path=str(tar))
    try:
        return Task(
            id=task_id,
            instruction=spec.instruction,
            workspace=workspace,
            setup_commands=list(spec.setup),
            verify_commands=[_verify_command(spec.verifier)],
            reward_file=REWARD_FILE,
            timeouts=TaskTimeouts(agent_s=spec.agent_timeout_s, test_s=spec.test_timeout_s),
            metadata={"inline": True, "files": json.dumps(sorted(spec.files))},
        )
    except ValueError as exc:
        raise TaskError(f"bad inline task: {exc}") from exc
