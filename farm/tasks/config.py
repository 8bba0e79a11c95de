"""Tasks section: where tasks and their repositories come from, and how they are graded."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from farm.images.config import ImagesConfig

TaskFormat = Literal["auto", "farm", "swebench", "swegym", "swesmith", "swerebench", "r2e"]


class TasksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(
        default="demo",
        description="task file (.jsonl / .json / .parquet) or 'demo' (the built-in demo set, generated into cache_dir)",
    )
    format: TaskFormat = Field(
        default="auto",
        description="row format; 'auto' detects it per row (farm, swebench, swesmith, r2e; SWE-Gym and SWE-rebench "
        "rows read as swebench: name the format to use their datasets' image layout, tasks.images.datasets)",
    )
    recipes: str | list[str] | None = Field(
        default="builtin",
        description="recipes (YAML: repository -> version -> python, setup, test command; see farm.tasks.recipes) "
        "filling in what SWE-bench-family rows leave to their docker image: 'builtin' = farm's recipe book "
        "(every repository-version of SWE-bench's harness specs, for local sandboxes); a file = the book with the "
        "file over it (per repository-version); a list = exactly those sources, later ones winning ('builtin' "
        "or files); 'none' = no recipes (e.g. E2B from the rows' own images)",
    )
    check_requirements: bool = Field(
        default=True,
        description="when rows load, check that this machine has what their recipe needs beyond PyPI (its python, "
        "system packages; the recipe's `requires`) and report the rows it lacks them for; turn off when sandboxes "
        "run on other machines than the one loading the tasks",
    )
    strict: bool = Field(
        default=False,
        description="refuse the whole file when a row is malformed, naming every bad row at once (default: report "
        "and skip them)",
    )
    mirror_dir: str | None = Field(
        default=None,
        description="directory of bare mirrors named <owner>__<repo>.git, looked up before any network fetch",
    )
    cache_dir: str = Field(
        default="~/.cache/farm/tasks",
        description="host cache: repos fetched from their URL, per-commit workspace tarballs, the demo set",
    )
    fetch: bool = Field(
        default=False,
        description="opt-in network fetch: when no mirror has a repo, clone it from its url (or "
        "https://github.com/<owner>/<repo>.git) into cache_dir once; False (the default, what air-gapped clusters "
        "need): a missing repo is a task error naming where farm looked, reported once, never retried",
    )
    python: str = Field(
        default="auto",
        description="interpreter whose directory is put first on PATH for setup, test and verify commands and the "
        "agent (a row's own `python` or its recipe's wins): 'auto' = the interpreter running farm (local sandboxes "
        "see the host read-only; on E2B the path does not exist and the template's python is used), but a "
        "SWE-bench / SWE-Gym / SWE-smith row that nothing gives an environment (no recipe, no setup commands, no "
        "image) is refused at load rather than run on it; 'host' = the same interpreter, and such rows run their "
        "tests on it (knowingly: they get its packages, not their repository's); a version ('3.11': pyenv, then "
        "python3.X on PATH) or an absolute path of a python inside the sandbox; 'none' = leave PATH alone. Any "
        "value but 'auto' says where tests run, so no row is refused for lacking an environment",
    )
    warm_pytest_caches: bool = Field(
        default=True,
        description="before the first sandbox of a host interpreter (tasks.python 'auto'/'host' or a version), write "
        "pytest's caches of its installed plugins there, and at an environment's build, its venvs' bytecode and "
        "plugin caches into the snapshot (farm.tasks.pycache): no sandbox keeps what it writes there, so without "
        "them every test run and every pytest an agent calls compiles and rewrites them all again (hypothesis: "
        "~0.6 s CPU a run); False: leave the interpreter's directories and the snapshot as setup left them",
    )
    max_diff_bytes: int = Field(
        default=4 << 20, ge=1024, description="largest model diff captured; a larger one is graded as patch_failed"
    )
    output_tail_chars: int = Field(default=4000, ge=0, description="chars of each command's stdout/stderr kept in reports")
    partial_credit: bool = Field(
        default=False,
        description="SWE reward = fraction of FAIL_TO_PASS tests passing (0 if any PASS_TO_PASS fails) instead of 1/0",
    )
    git_timeout_s: float = Field(default=900.0, gt=0, description="host-side git clone/fetch/archive budget")
    workspaces_max_bytes: int | None = Field(
        default=None, ge=0,
        description="after each workspace tarball is built, the least-recently-used ones in cache_dir/workspaces are "
        "removed until they fit (none used in the last 10 minutes: a sandbox may be unpacking it; one removed is "
        "built again when asked); None: never (a thousand SWE-bench commits are ~100-300 MB each)",
    )
    images: ImagesConfig = Field(
        default_factory=ImagesConfig,
        description="container images as environments (rows that name one, or whose dataset names them by "
        "convention): registry, mirrors, credentials, pull policy, per-dataset layout (farm.images)",
    )

    @field_validator("python")
    @classmethod
    def _python(cls, value: str) -> str:
        if value in ("auto", "host", "none") or value.startswith("/") or re.fullmatch(r"\d+(\.\d+){0,2}", value):
            return value
        raise ValueError(f"expected auto, host, none, a version ('3.11') or an absolute path, got {value!r}")
