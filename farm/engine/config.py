"""Engine section: which SGLang endpoint the gateway calls and how it is provided.

``mode`` picks how the router actor provides ``/generate``:

- ``external``: ``url`` points at an SGLang server or router the user runs.
- ``router``: farm launches the real ``sglang-router`` over ``worker_urls``.
- ``launch``: farm starts ``python -m sglang.launch_server`` workers (GPU nodes, the
  ``sglang`` extra) and the router in front of them.
- ``simulator``: farm starts ``simulator.workers`` simulated SGLang-protocol workers
  (``farm.simulator``, ``farm engine serve``: scripted policies, latency, faults, an optional
  tiny CPU model) behind the real router. The default for local runs.
"""

from __future__ import annotations

import os
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class MoEShape(BaseModel):
    """A mixture-of-experts model's routing shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: int = Field(gt=0, description="MoE layers (rows per token = layers x top_k)")
    top_k: int = Field(gt=0, description="experts chosen per token per layer")
    experts: int = Field(gt=1, le=65536, description="experts per layer")

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.experts <= 256 else np.dtype(np.uint16)

    @property
    def per_token(self) -> int:
        return self.layers * self.top_k


class EngineClientConfig(BaseModel):
    """The SGLang ``/generate`` client (``farm.engine.client.EngineClient``); set as
    ``gateway.engine_client`` (the gateway owns the client it calls through)."""

    model_config = ConfigDict(extra="forbid")

    connect_timeout_s: float = Field(default=10.0, gt=0, description="TCP connect to the engine")
    request_timeout_s: float = Field(
        default=1800.0, gt=0, description="one /generate call end to end (a hung engine fails after this)"
    )
    retries: int = Field(default=3, ge=0, description="extra attempts on connection errors / 5xx / dropped replies")
    backoff_s: float = Field(default=0.5, ge=0, description="first retry delay (doubles, jittered)")
    backoff_max_s: float = Field(default=8.0, ge=0, description="largest retry delay")
    pool_size: int = Field(default=2048, ge=1, description="max pooled connections to the engine")
    abort_request: bool = Field(
        default=True,
        description="also POST /abort_request {rid} on abort (workers honour it; the router answers 404, ignored)",
    )
    abort_timeout_s: float = Field(default=2.0, gt=0, description="the /abort_request call")
    routed_experts: MoEShape | None = Field(
        default=None, description="ask for routed experts and check them against this shape (set from engine.moe "
        "when engine.routed_experts is on)",
    )
    routed_experts_direct: bool = Field(
        default=True,
        description="with routed experts on, send /generate straight to a worker (picked by the session's routing "
        "key over the router's GET /workers: same session, same worker): sglang-router 0.3.2 drops "
        "return_routed_experts / routed_experts_start_len from the body it forwards",
    )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LatencyConfig(_Section):
    """Simulated generation speed of a simulator worker."""

    ttft_s: float = Field(default=0.0, ge=0, description="time to first token, seconds")
    tokens_per_s: float = Field(default=0.0, ge=0, description="decode speed; 0 = as fast as possible")
    jitter: float = Field(default=0.0, ge=0, le=1, description="relative +- noise on every delay")


class FaultConfig(_Section):
    """Injected failures of a simulator worker (drawn per request from the seeded RNG)."""

    error_rate: float = Field(default=0.0, ge=0, le=1, description="answer HTTP 500 before generating")
    hang_rate: float = Field(default=0.0, ge=0, le=1, description="never answer (until hang_s or disconnect)")
    drop_rate: float = Field(default=0.0, ge=0, le=1, description="close the connection mid-response")
    malformed_rate: float = Field(
        default=0.0, ge=0, le=1, description="answer HTTP 200 with a body that is not a /generate reply"
    )
    hang_s: float = Field(default=3600.0, gt=0, description="how long a hung request hangs")


class SimulatorConfig(_Section):
    """The simulator's workers (mode=simulator; also what ``farm engine serve`` runs)."""

    workers: int = Field(default=2, ge=1, description="simulator worker processes behind the router")
    seed: int = Field(default=0, description="makes policies, logprobs, latency and faults deterministic")
    tasks_path: str | None = Field(
        default=None, description="JSONL of farm Tasks for the oracle; default: the run's tasks.path"
    )
    replay_path: str | None = Field(default=None, description="recorded outputs for policy=replay (JSONL)")
    replies_path: str | None = Field(
        default=None, description="JSONL of replies for policy=scripted ({\"text\"} or {\"output_ids\"}); for policy=shell, "
        "the shell script per task ({\"task_id\", \"turns\": [[commands...], ...]})"
    )
    record_path: str | None = Field(
        default=None, description="append every finished response here (replay format); per worker '.<i>'"
    )
    model_path: str | None = Field(
        default=None, description="a farm tiny-LM checkpoint directory (farm.simulator.lm, a CPU test double for a GPU "
        "model): the workers sample the policy's choices from it and score every token they emit; "
        "update_weights_from_disk loads new ones. None: made-up logprobs"
    )
    torch_threads: int = Field(default=1, ge=1, description="torch threads per worker for model_path")
    stream_interval: int = Field(default=1, ge=1, description="tokens per streamed chunk (SGLang --stream-interval)")
    context_length: int = Field(default=131072, ge=1, description="reported max model length")
    latency: LatencyConfig = Field(default_factory=LatencyConfig, description="simulated generation speed")
    faults: FaultConfig = Field(
        default_factory=FaultConfig, description="injected failures (HTTP 500, hangs, drops, malformed replies)"
    )
    startup_timeout_s: float = Field(default=60.0, gt=0, description="wait for a worker's /health")

    @field_validator("model_path")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        """Workers start in other directories (Ray actors): resolve where the config is read."""
        return os.path.abspath(os.path.expanduser(v)) if v else v


class RouterConfig(_Section):
    """The real ``sglang-router`` (``python -m sglang_router.launch_router``)."""

    policy: Literal["manual", "cache_aware", "round_robin", "random", "power_of_two"] = Field(
        default="manual", description="manual = sticky by the X-SMG-Routing-Key header (session affinity)"
    )
    host: str = Field(default="127.0.0.1", description="bind address of the router")
    port: int = Field(default=0, ge=0, description="0 = a free port")
    request_timeout_s: int = Field(default=900, ge=1, description="--request-timeout-secs (router default 1800)")
    cb_timeout_s: int = Field(
        default=5, ge=1, description="--cb-timeout-duration-secs (router default 60 starves a restarted worker)"
    )
    health_check_interval_s: int = Field(default=5, ge=1, description="--health-check-interval-secs")
    max_retries: int = Field(default=3, ge=1, description="--retry-max-retries (non-streamed requests)")
    startup_timeout_s: float = Field(default=60.0, gt=0, description="wait for the router's workers")
    log_level: Literal["debug", "info", "warn", "error"] = Field(default="warn", description="router log level")
    extra_args: list[str] = Field(default_factory=list, description="appended to the router command")


class LaunchConfig(_Section):
    """SGLang server workers started by farm (mode=launch; GPU nodes, ``pip install farm[sglang]``)."""

    model_path: str | None = Field(default=None, description="--model-path (HF name or local path)")
    workers: int = Field(default=1, ge=1, description="servers (each a Ray actor with tp GPUs)")
    tp: int = Field(default=1, ge=1, description="--tp (tensor parallel size = GPUs per server)")
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1, description="--mem-fraction-static")
    context_length: int | None = Field(default=None, ge=1, description="--context-length")
    extra_args: list[str] = Field(default_factory=list, description="appended to launch_server")
    startup_timeout_s: float = Field(default=1800.0, gt=0, description="weights can take long to load")


class EngineConfig(_Section):
    mode: Literal["external", "router", "launch", "simulator"] = Field(
        default="simulator", description="how the router actor provides /generate"
    )
    policy: Literal["oracle", "noop", "replay", "scripted", "shell", "loop", "ramble", "choose"] = Field(
        default="oracle", description="the simulator's policy (mode=simulator); loop / ramble never stop (only a "
        "budget ends them: farm.simulator.endless); 'choose': the model picks one of each task's "
        "metadata.candidate_patches (see farm.simulator.choose)"
    )
    tokenizer: str = Field(
        default="builtin:farm-test",
        description="HF tokenizer path or name; 'builtin:farm-test' builds farm's own offline BPE",
    )
    tokenizer_cache_dir: str | None = Field(
        default=None, description="where builtin tokenizers are built; default ~/.cache/farm/tokenizers"
    )
    tool_parser: Literal["hermes", "qwen3_coder"] = Field(
        default="hermes", description="the model's tool-call format"
    )
    model_name: str = Field(default="farm-policy", description="name the CLIs are told to use")
    url: str | None = Field(default=None, description="mode=external: the SGLang server or router URL")
    worker_urls: list[str] = Field(default_factory=list, description="mode=router: SGLang worker URLs")
    health_timeout_s: float = Field(default=10.0, gt=0, description="per health / control request")
    routed_experts: Literal["off", "on"] = Field(
        default="off",
        description="MoE routing replay: every /generate asks for the experts it routed each token to "
        "(SGLang --enable-return-routed-experts); kept per token in every Sample",
    )
    moe: MoEShape | None = Field(
        default=None,
        description="the model's routing shape (layers, top_k, experts); routed_experts=on needs it; "
        "mode=simulator: the simulator's workers simulate this MoE",
    )
    weight_update_pause: Literal["retract", "in_place", "abort", "none"] = Field(
        default="retract",
        description="how generation is paused on every worker around a weight update (SGLang's "
        "/pause_generation mode; 'retract' recomputes running requests under the new weights, 'none' skips it)",
    )
    simulator: SimulatorConfig = Field(
        default_factory=SimulatorConfig, description="the simulated SGLang-protocol workers (farm.simulator; mode: simulator)"
    )
    router: RouterConfig = Field(
        default_factory=RouterConfig, description="the sglang-router farm starts (modes simulator, router, launch)"
    )
    launch: LaunchConfig = Field(
        default_factory=LaunchConfig, description="the SGLang servers farm starts on GPU nodes (mode: launch)"
    )

    @model_validator(mode="after")
    def _moe_shape_known(self) -> EngineConfig:
        if self.routed_experts == "on" and self.moe is None:
            raise ValueError("engine.routed_experts=on needs engine.moe (layers, top_k, experts) to check the "
                             "engine's routed experts against (read them off the model's config.json: "
                             "num_hidden_layers / num_experts_per_tok / num_experts)")
        return self

    def client_routing(self) -> MoEShape | None:
        """The shape the /generate client asks for and checks (None: routing replay off)."""
        return self.moe if self.routed_experts == "on" else None
