"""Sandbox section: which backend, and each backend's own settings.

``sandbox.backend`` picks the backend; ``sandbox.local`` and ``sandbox.e2b`` are that
backend's sections (both always present with defaults, so ``--set sandbox.backend=e2b``
switches backends without rewriting the YAML).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# how a local sandbox gets its copy-on-write view of an environment snapshot (farm.sandboxes.views)
ViewMode = Literal["auto", "overlay", "fuse-overlayfs", "copy"]


class LocalLimits(BaseModel):
    """Resource limits of a local sandbox.

    Whole-sandbox limits (every process of every command together): ``memory_bytes`` and
    ``pids`` through a cgroup per sandbox (v2 where its controllers are delegated, else
    v1; where neither is writable, ``memory_bytes`` falls back to a per-process
    RLIMIT_DATA and ``pids`` is not enforced: logged, and shown in ``limits_policy``),
    ``disk_bytes`` through a watchdog that checks every ``disk_check_s`` while a command
    runs: it sums the sandbox directory's allocated blocks when the processes' write counts
    (the kernel's, per process) could have taken the use over the limit, at least every
    ``disk_full_check_s`` (for what no write counts: ``fallocate``), after a command ends
    and after farm writes into it (overshoot bound: write speed x ``disk_check_s``;
    RLIMIT_FSIZE still caps each file). The sandbox's lifetime is ``SandboxSpec.timeout_s``. A breach kills
    the processes concerned and is recorded as the rollout's ``limit_exceeded`` reason.
    Per-process rlimits (``prlimit``; a bash script sets them with bash's ``ulimit``): ``nofile``,
    ``nproc``, ``file_size_bytes``, ``cpu_seconds``. ``None`` leaves a limit unset.
    """

    model_config = ConfigDict(extra="forbid")

    memory_bytes: int | None = Field(
        default=8 * 1024**3, ge=16 << 20, description="memory of the whole sandbox (cgroup; OOM-kill on breach)"
    )
    pids: int | None = Field(default=1024, ge=16, description="processes + threads of the whole sandbox (cgroup)")
    disk_bytes: int | None = Field(
        default=10 * 1024**3, ge=1 << 20, description="disk used by the sandbox's directories (watchdog)"
    )
    disk_check_s: float = Field(
        default=2.0, gt=0, description="how often the disk watchdog checks usage (while a command runs)"
    )
    disk_full_check_s: float = Field(
        default=30.0,
        gt=0,
        description="how often, at least, the disk watchdog walks the sandbox's directories while a command runs "
        "(between walks, the processes' write counts bound the use)",
    )
    nofile: int | None = Field(default=4096, ge=16, description="RLIMIT_NOFILE: open files per process")
    nproc: int | None = Field(
        default=1024,
        ge=8,
        description="RLIMIT_NPROC: processes per command tree (own user namespace); "
        "the kernel exempts real root (uid 0) from this limit",
    )
    file_size_bytes: int | None = Field(
        default=4 * 1024**3, ge=1 << 20, description="RLIMIT_FSIZE: largest file a command may write"
    )
    cpu_seconds: int | None = Field(default=None, ge=1, description="RLIMIT_CPU: CPU seconds per process")


class LocalSandboxConfig(BaseModel):
    """The local backend: one workspace directory per sandbox, commands under bubblewrap."""

    model_config = ConfigDict(extra="forbid")

    base_dir: str = Field(
        default="/tmp/farm-sandboxes",
        description="sandboxes live in <base_dir>/<run_id>/<sandbox_id>/ (hidden from every sandbox); ~ and "
        "$VARS are expanded on the node that creates the sandbox (a per-node root on a shared disk)",
    )
    isolation: Literal["bwrap", "none"] = Field(
        default="bwrap",
        description="'none' runs commands directly on the host (explicit opt-in, logs a warning)",
    )
    bwrap_path: str = Field(default="bwrap", description="bubblewrap binary (Debian package 'bubblewrap')")
    ro_binds: list[str] = Field(
        default_factory=list,
        description="extra host paths shown read-only at the same path (the sandbox sees a minimal host: "
        "system runtime, selected /etc files, farm's Python, the harness CLI; nothing else)",
    )
    network: Literal["isolated", "host"] = Field(
        default="isolated",
        description="the agent's network: 'isolated' = own loopback only, plus the forwarded gateway port; "
        "'host' = the host's network, Ray and every other session included (logs a warning)",
    )
    setup_network: Literal["host", "isolated"] = Field(
        default="host",
        description="the network of task setup (commands before isolate_network()): 'host' lets setup "
        "install packages from the registries; the agent and the tests under grading never get it",
    )
    uid: int = Field(default=1000, ge=1, description="the unprivileged uid/gid commands run as inside the jail")
    unshare_user: bool = Field(
        default=True,
        description="own user namespace per command (needed for exec(user=...) and per-tree RLIMIT_NPROC)",
    )
    path: str = Field(default=DEFAULT_PATH, description="PATH inside the sandbox (override per command via env)")
    limits: LocalLimits = Field(
        default_factory=LocalLimits, description="resource limits of each local sandbox (cgroup, disk watchdog, rlimits)"
    )
    view: ViewMode = Field(
        default="auto",
        description="how a sandbox gets its private copy-on-write view of an environment snapshot: 'overlay' "
        "(kernel overlayfs, needs root), 'fuse-overlayfs' (unprivileged), 'copy' (full copy; reflinked on "
        "btrfs/xfs); 'auto' = the first that works here (see farm.sandboxes.views)",
    )
    runtime_dir: str = Field(
        default="~/.cache/farm/hostrt",
        description="where the host programs a container-image sandbox runs (the agent CLI, prlimit, socat) are "
        "kept relinked on their own loader and libraries, once per node (farm.sandboxes.hostrt)",
    )
    keep: bool = Field(default=False, description="keep the sandbox directory after close (debugging)")
    kill_grace_s: float = Field(default=10.0, gt=0, description="how long to wait for a killed tree to exit")


class E2BSandboxConfig(BaseModel):
    """The E2B backend (``e2b`` SDK ``AsyncSandbox``). The API key is not config: the entry
    point reads ``E2B_API_KEY`` and passes it in."""

    model_config = ConfigDict(extra="forbid")

    template: str | None = Field(
        default=None, description="default template/image when the task names none (None = E2B's base)"
    )
    domain: str | None = Field(default=None, description="E2B domain (None = the SDK's default)")
    request_timeout_s: float = Field(default=60.0, gt=0, description="per API request timeout")
    create_rate_per_s: float = Field(default=2.0, gt=0, description="client-side sandbox creates per second")
    create_burst: int = Field(default=2, ge=1, description="creates allowed back to back")
    max_concurrent: int = Field(default=20, ge=1, description="live sandboxes per limiter (per actor)")
    retries: int = Field(default=3, ge=0, description="retries of idempotent calls (create, files, list, kill)")
    backoff_s: float = Field(default=1.0, gt=0, description="first retry delay (doubles each retry)")
    user: str = Field(default="user", description="default user commands run as")
    root: str = Field(default="/home/user", description="writable root path inside the sandbox")


class SandboxPoolConfig(BaseModel):
    """``sandbox.pool``: warm sandboxes per environment (``farm.sandboxes.pool``)."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(
        default=0,
        ge=0,
        description="ready sandboxes kept per environment, made in the background and handed out once each "
        "(0: no pool, every sandbox is created when its rollout asks); they are live sandboxes: they count "
        "against the create limiter's cap and, on E2B, against the plan and its bill",
    )
    max_environments: int = Field(
        default=4, ge=1, description="environments with a pool at once (the least recently used one is drained first)"
    )
    max_idle_s: float = Field(
        default=120.0,
        gt=0,
        description="a pooled sandbox idle longer than this is closed, not handed out (its lifetime runs from "
        "its create; keep this well under the slack rollouts add to their lifetime)",
    )
    refill_concurrency: int = Field(default=2, ge=1, description="background creates at once, all environments together")


class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "e2b"] = Field(default="local", description="where rollouts run")
    max_output_bytes: int = Field(
        default=8 * 1024**2,
        ge=1024,
        description="captured stdout/stderr per stream and command (head + tail kept, middle dropped)",
    )
    local: LocalSandboxConfig = Field(
        default_factory=LocalSandboxConfig, description="settings of the local backend (used when backend: local)"
    )
    e2b: E2BSandboxConfig = Field(
        default_factory=E2BSandboxConfig, description="settings of the E2B backend (used when backend: e2b)"
    )
    pool: SandboxPoolConfig = Field(
        default_factory=SandboxPoolConfig,
        description="warm sandboxes per environment, made ahead of the rollouts (farm.sandboxes.pool; off by default)",
    )
