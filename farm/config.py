"""The one root config of a run: ``FarmConfig``, loaded from YAML + ``--set a.b=c``.

Each component owns and validates its own section (imported from its package's
``config`` module). This module imports only config types.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from farm.engine.config import EngineConfig
from farm.envs.config import EnvsConfig
from farm.errors import ConfigError
from farm.gateway.config import GatewayConfig, url_fields
from farm.gateway.endpoints import FARM_ENDPOINT, EndpointConfig, FarmEndpoint, RolloutMode
from farm.grading.config import GradingConfig
from farm.harnesses.config import HarnessConfig
from farm.loggers.config import LoggerConfig
from farm.output.config import ArtifactsConfig, OutputConfig
from farm.run.config import StreamConfig
from farm.sandboxes.config import SandboxConfig
from farm.tasks.config import TasksConfig


# Why a gateway URL per sandbox actor, and how to give one (config validation and the actors' start).
ONE_URL_PER_ACTOR = (
    "every sandbox actor hosts its own gateway, and sandboxes that reach it by this URL (E2B) would all reach the "
    "one behind it, which knows none of the other actors' sessions. Give each its own: a template naming the node "
    "and the gateway's port, e.g. 'http://{node_ip}:{port}' (nodes the sandboxes can reach), or "
    "'https://gw-{hostname}.example.com' (one tunnel per node, gateway.port fixed, "
    "placement.sandbox_actors_per_node: 1); or run one sandbox actor (ray.num_sandbox_actors: 1)"
)

# Where `farm rollout`, `farm serve` and farm.Rollouts write (see load_single_config): a config
# file's output.dir is `farm run`'s (its resume, summary and groups are one task set's), so
# one-at-a-time rollouts go beside it, into this directory, unless an override names another.
SINGLE_DIR = "rollouts"


def run_id_of(output_dir: str) -> str:
    """The default run id: the output directory's name (``runs/noop`` -> ``noop``), as a
    path component and Ray actor name can hold it. Two runs into two directories get two
    ids, so neither reaps the other's sandboxes."""
    name = os.path.basename(os.path.normpath(os.path.abspath(os.path.expanduser(output_dir))))
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
    return cleaned or "run"


class RolloutConfig(BaseModel):
    """How rollouts are expanded, run and bounded."""

    model_config = ConfigDict(extra="forbid")

    n_samples: int = Field(default=1, ge=1, description="rollouts per task (one GRPO group)")
    concurrency: int = Field(default=4, ge=1, description="rollouts in flight per sandbox actor")
    max_turns: int = Field(default=50, ge=1, description="model calls per rollout")
    timeout_s: float = Field(default=3600.0, gt=0, description="whole-rollout budget (sandbox to grade)")
    agent_timeout_s: float | None = Field(
        default=None, gt=0, description="agent budget; default: the task's timeouts.agent_s"
    )
    agent_idle_timeout_s: float | None = Field(
        default=300.0, gt=0,
        description="a CLI with no model request in flight and no tool running for this long is stuck: killed "
        "and recorded as agent_error (infrastructure, retried), never the policy's timeout; None = off "
        "(local sandboxes only: E2B cannot tell a running tool)",
    )
    max_attempts: int = Field(
        default=3, ge=1, description="dispatches of one rollout when the actor running it dies"
    )
    sandbox_create_rate: float = Field(
        default=4.0, gt=0, description="sandbox creates per second per sandbox actor"
    )
    sandbox_create_concurrency: int = Field(
        default=8, ge=1, description="live sandboxes at once per sandbox actor (a rollout's agent and grading sandboxes each hold one until closed; raise it with rollout.concurrency)"
    )
    limit: int | None = Field(default=None, ge=1, description="run only the first N rollouts (smoke runs)")
    infra_retries: int = Field(
        default=2, ge=0, description="reruns of a rollout that failed for infrastructure reasons (policy outcomes never)"
    )
    retry_backoff_s: float = Field(
        default=2.0, ge=0, description="delay before the first infrastructure retry (doubles each retry)"
    )
    on_truncated: Literal["grade", "zero", "exclude"] = Field(
        default="grade",
        description="a rollout whose policy ran out of its turn, context or output budget (status truncated): "
        "'grade' = its diff graded as it stands, Samples with that reward; 'zero' = not graded, Samples with "
        "reward 0; 'exclude' = graded, its row kept, no Samples (DAPO-style overlong filtering)",
    )

    @property
    def lifetime_s(self) -> float:
        """How long what serves one rollout lives (a sandbox, a served session): the rollout's
        budget plus a grace, so that the budget's own timeout always fires first (recorded as
        the rollout's) and teardown and result collection still find the sandbox there."""
        return self.timeout_s + 300.0


class RayConfig(BaseModel):
    """Where the farm's actors run."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = Field(
        default=None,
        description="ray.init address: None starts a local Ray (or joins the one `ray job submit` provides); "
        "'auto' joins a running cluster",
    )
    namespace: str = Field(default="farm", description="Ray namespace of the named actors")
    num_cpus: int | None = Field(default=None, ge=1, description="CPUs of a locally started Ray")
    include_dashboard: bool | None = Field(default=None, description="dashboard of a locally started Ray")
    num_sandbox_actors: int | None = Field(
        default=None, ge=1,
        description="a fixed number of sandbox actors spread over the sandbox nodes; default: "
        "placement.sandbox_actors_per_node on each sandbox node, and on nodes that join mid-run"
    )
    env_affinity: bool = Field(
        default=True,
        description="send a task's rollouts to the sandbox actor (node) that ran it first while it has a free slot: "
        "its environment snapshot is built there (each node keeps its own cache); others take the overflow",
    )
    sandbox_actor_cpus: float = Field(default=0.0, ge=0, description="CPUs reserved per sandbox actor")
    actor_max_restarts: int = Field(default=3, ge=0, description="restarts of a dead sandbox actor")
    reducer_flush_s: float = Field(
        default=2.0, gt=0, description="the reducer makes buffered rollouts durable at least this often"
    )
    drain_timeout_s: float = Field(
        default=60.0, gt=0, description="on Ctrl-C / job stop: wait this long for cancelled rollouts to clean up"
    )


class PlacementConfig(BaseModel):
    """Which nodes of a Ray cluster run what (``farm.actors.placement``)."""

    model_config = ConfigDict(extra="forbid")

    sandbox_resource: str | None = Field(
        default=None,
        description="custom node resource marking sandbox (CPU) nodes, e.g. 'sandbox_node' (ray start "
        "--resources='{\"sandbox_node\": 1}'); None: every alive node runs sandbox actors",
    )
    engine_resource: str | None = Field(
        default=None, description="custom node resource marking the engine (GPU) node the router actor goes to",
    )
    sandbox_actors_per_node: int = Field(
        default=1, ge=1, description="sandbox actors started on each sandbox node (each runs rollout.concurrency)",
    )
    watch_nodes_s: float = Field(
        default=5.0, ge=0,
        description="look for sandbox nodes that joined mid-run this often and start their actors; 0 = never",
    )


class FarmConfig(BaseModel):
    """A whole run."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(
        default="",
        description="names the run: labels its sandboxes (and `farm reap --run-id`), Samples, Ray actors, metrics "
        "and the report's title; default (empty): the name of output.dir (runs/noop -> noop)",
    )
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="the task set: the task file, its row format and recipes, where repositories come from (farm.tasks)")
    envs: EnvsConfig = Field(default_factory=EnvsConfig, description="environment snapshots: each task's environment built once and cloned per sandbox (farm.envs)")
    grading: GradingConfig = Field(default_factory=GradingConfig, description="how a rollout's diff is graded in a fresh sandbox: tests, reward, reward-hack checks (farm.grading)")
    harness: HarnessConfig = Field(default_factory=HarnessConfig, description="the coding-agent CLI each rollout runs (Claude Code, Codex, OpenCode) and how it is launched")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="where rollouts run: the sandbox backend (local or E2B) and its settings")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="the policy's SGLang engine: how /generate is provided (simulator, router, launch, external), tokenizer")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="the model gateway each sandbox actor runs: the CLIs' wire protocols to token-exact /generate calls")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="how rollouts are expanded (n_samples per task), run concurrently, bounded and retried")
    stream: StreamConfig = Field(default_factory=StreamConfig, description="how the task set becomes a stream of groups: epochs, shuffle, curriculum, staleness (farm.Farm)")
    output: OutputConfig = Field(default_factory=OutputConfig, description="where and how Samples and the rollouts table are written (the output directory)")
    artifacts: ArtifactsConfig = Field(default_factory=ArtifactsConfig, description="per-rollout artifact files under <output.dir>/artifacts/ (logs, turns, diff, grading, task)")
    loggers: list[LoggerConfig] = Field(
        default_factory=list, description="run loggers (W&B, MLflow): none by default; each gets the metrics and summary"
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="the Ray cluster the farm's actors run on and how many sandbox actors it starts")
    endpoints: dict[str, EndpointConfig] = Field(
        default_factory=dict, description="named model endpoints (farm.gateway.endpoints); 'farm' is built in"
    )
    endpoint: str = Field(
        default=FARM_ENDPOINT,
        description="the endpoint the CLIs are served by: 'farm' (the engine, token-exact, Samples) or a name "
        "in `endpoints` (a hosted one runs black-box: transcripts, no Samples, no engine started)",
    )
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="which nodes of a Ray cluster run sandbox actors and which one runs the engine")

    @model_validator(mode="after")
    def _default_run_id(self) -> "FarmConfig":
        if not self.run_id:
            self.run_id = run_id_of(self.output.dir)
        return self

    @model_validator(mode="after")
    def _known_endpoint(self) -> "FarmConfig":
        if self.endpoint != FARM_ENDPOINT and self.endpoint not in self.endpoints:
            known = ", ".join(sorted({FARM_ENDPOINT, *self.endpoints}))
            raise ValueError(f"endpoint {self.endpoint!r} is not in the endpoints catalog (known: {known})")
        return self

    @model_validator(mode="after")
    def _a_gateway_url_per_actor(self) -> "FarmConfig":
        """Every sandbox actor hosts its own gateway: sandboxes reaching it by ``gateway.public_url``
        (E2B) need a URL per actor. What the config alone shows is refused here; what only the
        started actors show (a fixed URL on a cluster of several nodes) when they start
        (``farm.actors.assembly``)."""
        url = self.gateway.public_url
        if not url:
            return self
        fields, per_node = url_fields(url), self.placement.sandbox_actors_per_node
        several = (self.ray.num_sandbox_actors or 1) > 1 or per_node > 1
        if not fields and several:
            what = (f"ray.num_sandbox_actors: {self.ray.num_sandbox_actors}" if (self.ray.num_sandbox_actors or 1) > 1
                    else f"placement.sandbox_actors_per_node: {per_node}")  # fmt: skip
            raise ValueError(f"gateway.public_url {url!r} is one fixed URL, but the run starts several sandbox actors "
                             f"({what}): {ONE_URL_PER_ACTOR}")  # fmt: skip
        if fields and "port" not in fields and per_node > 1:
            raise ValueError(f"gateway.public_url {url!r} names no {{port}}, but placement.sandbox_actors_per_node: "
                             f"{per_node} puts several sandbox actors on one node, which would share that URL: "
                             f"{ONE_URL_PER_ACTOR}")  # fmt: skip
        return self

    @property
    def active_endpoint(self) -> EndpointConfig:
        """The endpoint config of ``endpoint`` (the farm engine unless the catalog names another)."""
        return self.endpoints.get(self.endpoint) or FarmEndpoint()

    @property
    def mode(self) -> RolloutMode:
        """How the run's CLIs are served (its endpoint's mode): what to start, what a rollout
        records and writes, what can fail its session. Ask it, never the endpoint's kind."""
        return self.active_endpoint.mode

    @property
    def black_box(self) -> bool:
        """``mode is RolloutMode.BLACK_BOX``: for a user's scripts and notebooks; farm's own
        code asks ``mode`` what it needs (tests/test_mode_guard.py keeps it so)."""
        return self.mode is RolloutMode.BLACK_BOX


def endpoint_api_key(cfg: FarmConfig, environ: Mapping[str, str]) -> str | None:
    """The API key of the hosted endpoint ``cfg.endpoint`` names, from ``environ`` (the
    entry point passes ``os.environ``): None for the farm engine or an endpoint without
    ``api_key_env``; a ConfigError when the variable is unset or empty."""
    name = getattr(cfg.active_endpoint, "api_key_env", None)  # the farm engine has none
    if not name:
        return None
    key = environ.get(name)
    if not key:
        raise ConfigError(f"endpoint {cfg.endpoint!r} reads its API key from ${name}, which is not set")
    return key


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``a.b=c`` -> ("a.b", c) with the value parsed as YAML (numbers, bools, lists)."""
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    return key.strip(), yaml.safe_load(raw) if raw else ""


def _has_dotted(data: Mapping[str, Any], key: str) -> bool:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _read_yaml(path: str | Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        loaded = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config {path}: top level must be a mapping")
    return loaded or {}


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> FarmConfig:
    """Load YAML (or defaults when ``path`` is None) and apply dotted overrides."""
    data = _read_yaml(path)
    for item in overrides:
        _set_dotted(data, *parse_override(item))
    return _validated(data, path)


def load_single_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> FarmConfig:
    """The config of one-at-a-time rollouts (``farm.Rollouts``, ``farm rollout``, ``farm
    serve``): ``load_config``'s, except where they are written. ``output.dir`` and
    ``run_id`` are taken from ``overrides`` only: a config file's ``output.dir`` is `farm
    run`'s directory, so they go beside it, into ``rollouts`` (``runs/local`` ->
    ``runs/rollouts``, ``/data/runs/swe`` -> ``/data/runs/rollouts``: the disk the config
    chose), with the run id ``rollouts`` (sandboxes are labelled, and reaped, by run id: a
    `farm run` of the same config keeps its own)."""
    data = _read_yaml(path)
    told: dict[str, Any] = {}
    for item in overrides:
        _set_dotted(data, *parse_override(item))
        _set_dotted(told, *parse_override(item))
    if not _has_dotted(told, "output.dir"):
        section = data.get("output")
        batch_dir = section.get("dir") if isinstance(section, dict) else None
        if not isinstance(batch_dir, str):  # unset (or invalid: the model's validation says so)
            batch_dir = OutputConfig().dir if batch_dir is None else None
        if batch_dir is not None:
            _set_dotted(data, "output.dir", os.path.join(os.path.dirname(os.path.normpath(batch_dir)), SINGLE_DIR))
    if not _has_dotted(told, "run_id"):
        data.pop("run_id", None)  # derived from the directory (FarmConfig._default_run_id)
    return _validated(data, path)


def _validated(data: dict[str, Any], path: str | Path | None) -> FarmConfig:
    try:
        return FarmConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config {path or '<defaults>'}:\n{exc}") from exc
