"""Harness section: which coding-agent CLI runs the rollouts, pinned and configured."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

HarnessName = Literal["claude_code", "codex", "opencode"]

# The npm versions farm is tested with (captures and end-to-end tests use exactly these).
PINNED_VERSIONS: dict[str, str] = {
    "claude_code": "2.1.197",
    "codex": "0.169.0",
    "opencode": "1.18.33",
}


class HarnessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: HarnessName = Field(default="claude_code", description="the CLI every rollout runs")
    versions: dict[HarnessName, str] = Field(
        default_factory=lambda: dict(PINNED_VERSIONS),
        description="npm version per CLI (defaults: the versions farm is tested with)",
    )
    npm_cache_dir: str = Field(
        default="~/.cache/farm/npm",
        description="shared host cache: one `npm install --prefix` dir per CLI version, installed once per "
        "machine; local sandboxes bind it read-only at the same path",
    )
    npm_registry: str | None = Field(default=None, description="npm registry URL (None: npm's own default)")
    install_timeout_s: float = Field(default=900.0, gt=0, description="budget for one npm install (incl. the lock wait)")
    bin_path: str | None = Field(
        default=None,
        description="path of the CLI executable inside the sandbox (e.g. an E2B template with the CLI "
        "preinstalled); skips the cache check and the upload",
    )
    upload_dir: str | None = Field(
        default=None,
        description="where the cached CLI is uploaded when the sandbox cannot see the host cache "
        "(default <sandbox root>/.farm/cli)",
    )
    scratch_dir: str | None = Field(
        default=None,
        description="per-rollout dir for the CLI's HOME, config and output (default <sandbox tmp>/.farm/harness: "
        "the same path in every sandbox, so the CLI's prompt is too); never inside the task's workdir, so nothing "
        "farm writes lands in the diff",
    )
    context_window: int = Field(default=131072, gt=0, description="context size the CLI is told (OpenCode limit.context, Codex model_context_window)")
    max_output_tokens: int = Field(
        default=16384, gt=0, description="max tokens per model reply the CLI asks for (Claude Code, OpenCode; Codex has no such setting)"
    )
    extra_args: list[str] = Field(default_factory=list, description="appended to the CLI's argv")
    extra_env: dict[str, str] = Field(default_factory=dict, description="added to (and overriding) the CLI's env")
    probe_timeout_s: float = Field(
        default=10.0, gt=0, description="how long to try reaching the gateway from inside the sandbox before launch"
    )
    watch_interval_s: float = Field(
        default=10.0,
        ge=0,
        description="while the CLI runs, every this many seconds: look for a CLI stuck retrying model requests "
        "and probe the gateway unless it served the session within the interval (0 disables; the time budget "
        "still applies)",
    )
    max_failed_probes: int = Field(
        default=3, ge=1, description="consecutive failed gateway probes during a run before the CLI is killed"
    )
    max_client_retries: int = Field(
        default=4,
        ge=1,
        description="consecutive retries of a model request the CLI reports (Claude Code api_retry, Codex "
        "'Reconnecting...') before it is killed as stuck",
    )
    output_tail_chars: int = Field(default=8000, ge=0, description="chars of raw stdout/stderr kept in the result")
