"""The task model: one SWE or generic setup/verify task, in farm's own format.

This is the single task model of the project: the scripted oracle engine reads it
(instruction, gold patch / solution commands, test command) and the grader reads it
(test patch, FAIL_TO_PASS / PASS_TO_PASS, log parser, verify commands). Loaders for
other formats (SWE-bench, SWE-smith, SWE-Gym, R2E-Gym) convert *into* this model.

Two kinds of task:

- **swe**: a repository at a base commit; graded by applying the model's diff and the
  task's test patch in a fresh sandbox, running ``test_command`` and checking that every
  FAIL_TO_PASS and PASS_TO_PASS test passes (or, R2E-Gym style, that every test in
  ``expected_test_statuses`` ends with the expected status).
- **generic**: any workspace (or none); graded by running ``verify_commands`` after the
  model's diff; the reward is the float a verifier wrote to ``reward_file``, else
  passed/total commands.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GitSource(_Model):
    """A git repository at a base commit."""

    type: Literal["git"] = "git"
    repo: str | None = Field(
        default=None, description="owner/name; looked up as <mirror_dir>/<owner>__<name>.git first"
    )
    url: str | None = Field(default=None, description="clone URL or local path (fallback)")
    base_commit: str = Field(description="commit the agent starts from and the grader diffs against")

    @model_validator(mode="after")
    def _need_location(self) -> "GitSource":
        if not self.repo and not self.url:
            raise ValueError("a git source needs 'repo' (owner/name) or 'url'")
        if self.repo and not _REPO_RE.match(self.repo):
            raise ValueError(f"repo must look like owner/name, got {self.repo!r}")
        if not re.fullmatch(r"[A-Za-z0-9_./~^@{}-]+", self.base_commit) or self.base_commit.startswith("-"):
            raise ValueError(f"base_commit is not a commit: {self.base_commit!r}")
        return self

    @property
    def mirror_name(self) -> str | None:
        """``owner__name.git``: the bare mirror's directory name."""
        if not self.repo:
            return None
        owner, name = self.repo.split("/", 1)
        return f"{owner}__{name}.git"


class TarballSource(_Model):
    """A tarball (on the host running farm) unpacked into the workspace, then committed so diffs work."""

    type: Literal["tarball"] = "tarball"
    path: str


class ImageSource(_Model):
    """A container image (local sandboxes: its file system is the sandbox's root; E2B: the
    template of that name) that already holds the workspace at ``Task.workdir``."""

    type: Literal["image"] = "image"
    image: str = Field(description="the image's name, as docker reads it ('swebench/sweb.eval.x86_64.x:latest')")
    base_commit: str | None = Field(default=None, description="checked out when given (else HEAD as is)")
    activate: str | None = Field(
        default=None,
        description="bash run once in the image (local sandboxes): the environment it leaves is every command's "
        "(e.g. 'source /opt/miniconda3/bin/activate && conda activate testbed')",
    )


WorkspaceSource = Annotated[GitSource | TarballSource | ImageSource, Field(discriminator="type")]


class TaskTimeouts(_Model):
    """Per-phase budgets in seconds."""

    workspace_s: float = Field(default=600.0, gt=0, description="materialize the repo/tarball in the sandbox")
    setup_s: float = Field(default=600.0, gt=0, description="each setup command")
    agent_s: float = Field(default=1800.0, gt=0, description="the agent CLI")
    test_s: float = Field(default=900.0, gt=0, description="the test command, and each verify command")


TestStatusName = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"]


def _json_list(value: Any) -> Any:
    """SWE-bench stores FAIL_TO_PASS / PASS_TO_PASS as JSON strings."""
    if isinstance(value, str):
        value = value.strip()
        if not value:
            return []
        parsed = json.loads(value)
        if not isinstance(parsed, list):
            raise ValueError("expected a JSON list of test ids")
        return parsed
    return value


class Task(_Model):
    """One task. SWE tasks have tests (FAIL_TO_PASS/PASS_TO_PASS); generic ones verify commands."""

    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    workspace: WorkspaceSource | None = Field(default=None, description="None: an empty git-initialised dir")
    workdir: str = Field(default="repo", description="workspace dir, relative to the sandbox root (or absolute)")
    image: str | None = Field(
        default=None,
        description="E2B: the template the task's sandboxes are created from; local sandboxes run from a container "
        "image given as the workspace (an image source), not by this field",
    )
    pre_patch: str | None = Field(
        default=None,
        description="diff applied on top of the base commit before setup and committed as a parentless "
        "'task base' commit (SWE-smith: the bug-introducing patch); hides the history",
    )
    setup_commands: list[str] = Field(default_factory=list, description="run one by one in workdir; any failure = setup_failed")
    base_setup_commands: list[str] = Field(
        default_factory=list,
        description="the heavy, instance-independent part of setup (a venv and the repository-version's "
        "packages), run once per (repository, version, recipe) in a base environment that several tasks "
        "share; setup_commands then run per instance on top of it (see farm.envs)",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra env for setup, test and verify commands")
    python: str | None = Field(
        default=None,
        description="this task's interpreter (first on PATH for setup, tests and the agent): a version found on "
        "the machine ('3.9', '3.11.7': pyenv, then python3.X on PATH), an absolute path, or None = tasks.python",
    )
    # How a competent agent would solve it (oracle policy; validation).
    gold_patch: str | None = None
    solution_commands: list[str] = Field(default_factory=list)
    # SWE grading.
    test_patch: str | None = None
    test_command: str | None = None
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_pass: list[str] = Field(default_factory=list)
    expected_test_statuses: dict[str, TestStatusName] = Field(
        default_factory=dict,
        description="R2E-Gym style: resolved iff the parsed statuses equal these exactly (same test set)",
    )
    log_parser: str = Field(
        default="pytest",
        description="how the test output is read: farm's pytest, unittest, junit, r2e, django, sympy, or any of "
        "SWE-bench's parse_log_<name> (farm.grading.parsers); checked when the rows load",
    )
    test_surface: list[str] | None = Field(
        default=None,
        description="glob patterns (workdir-relative) of the files the policy's diff may not change for grading "
        "(reset before the tests run); None = farm's default surface (tests, conftest.py, pytest/tox config, "
        "start-up hooks: see farm.grading.surface)",
    )
    test_report_file: str | None = Field(
        default=None, description="file the test command writes (relative to workdir), e.g. JUnit XML for log_parser=junit"
    )
    # Generic grading: reward = float in reward_file if written, else passed/total.
    verify_commands: list[str] = Field(default_factory=list)
    reward_file: str | None = Field(
        default=None,
        description="where a verifier may write a float reward (relative to workdir, or absolute); "
        "deleted before verification; exported as $FARM_REWARD_FILE (None: a fresh path outside the workspace is "
        "exported instead); a verifier using farm_verify gives its reward through farm's witness (farm.grading.reward)",
    )
    timeouts: TaskTimeouts = Field(default_factory=TaskTimeouts)
    metadata: dict[str, Any] = Field(default_factory=dict)

    _lists = field_validator("fail_to_pass", "pass_to_pass", mode="before")(_json_list)

    @field_validator("metadata", "expected_test_statuses", mode="before")
    @classmethod
    def _json_dict(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @model_validator(mode="after")
    def _gradable(self) -> "Task":
        if self.kind == "swe" and not self.test_command:
            raise ValueError("a SWE task (tests / test patch) needs a test_command")
        if self.fail_to_pass and set(self.fail_to_pass) & set(self.pass_to_pass):
            raise ValueError("a test is listed in both fail_to_pass and pass_to_pass")
        return self

    @property
    def kind(self) -> Literal["swe", "generic"]:
        swe = self.fail_to_pass or self.pass_to_pass or self.test_patch or self.expected_test_statuses
        return "swe" if swe else "generic"
