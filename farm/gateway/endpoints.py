"""The endpoint catalog: named model endpoints a run's CLIs can be served by.

``farm`` (the default) is the farm's own engine, token in / token out through the
gateway: every turn recorded token-exact, Samples written. A hosted endpoint
(``openai``: an OpenAI-compatible chat or responses API; ``anthropic``: the Messages
API) puts the gateway in **black-box** mode (:mod:`farm.gateway.blackbox`): it
translates each CLI request to the endpoint's protocol, records the canonical
transcript (no token ids), and no Sample is ever written. The API key is never in
the config: ``api_key_env`` names the environment variable the entry point
(``farm run``) reads it from. This module holds only config types.

Each endpoint kind says which :class:`RolloutMode` it serves a run in
(``FarmConfig.mode``); the run's code asks the mode what to do, never the endpoint's kind.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

FARM_ENDPOINT = "farm"


class RolloutMode(StrEnum):
    """How a run's CLIs are served, fixed by its endpoint (``FarmConfig.mode``). The value
    is what the rollouts table's ``mode`` column holds."""

    TOKEN_EXACT = "token_exact"  # the farm's engine: every turn's token ids recorded (a TurnTree), Samples
    BLACK_BOX = "black_box"  # a hosted endpoint: canonical messages only (a Transcript), never a Sample

    @property
    def needs_engine(self) -> bool:
        """The farm's engine (and the policy's tokenizer) serves the CLIs: started with the run."""
        return self is RolloutMode.TOKEN_EXACT

    @property
    def writes_samples(self) -> bool:
        """A rollout's record is a token TurnTree, linearized into Samples when its outcome is
        trainable; else a Transcript, written to the transcripts table and never a Sample."""
        return self is RolloutMode.TOKEN_EXACT

    @property
    def endpoint_fails_sessions(self) -> bool:
        """The endpoint can fail a whole session for good (a refused key, retries spent): the
        rollout watches for it and ends at once with that status. The engine path fails
        single turns (the CLI retries them), never a session."""
        return self is RolloutMode.BLACK_BOX


class _Endpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FarmEndpoint(_Endpoint):
    """The farm's own engine (``engine:`` section): token-exact, trainable."""

    mode: ClassVar[RolloutMode] = RolloutMode.TOKEN_EXACT
    kind: Literal["farm"] = Field(default="farm", description="selects the farm's own engine (token-exact)")


class _HostedEndpoint(_Endpoint):
    mode: ClassVar[RolloutMode] = RolloutMode.BLACK_BOX
    base_url: str = Field(description="the API root, e.g. https://api.openai.com/v1 (routes are appended)")
    model: str = Field(min_length=1, description="the model name sent to the endpoint (the CLI's is replaced)")
    api_key_env: str | None = Field(
        default=None, description="environment variable `farm run` reads the API key from (None: no key sent)"
    )
    max_tokens: int | None = Field(default=None, ge=1, description="cap on each request's output tokens")
    headers: dict[str, str] = Field(default_factory=dict, description="extra HTTP headers sent on every request")
    timeout_s: float = Field(default=600.0, gt=0, description="one request, connect to last byte")
    max_retries: int = Field(default=4, ge=0, description="retries of a 429 / 5xx / timeout before the turn fails")
    retry_budget_s: float = Field(
        default=120.0, gt=0, description="total time a turn may spend waiting to retry (a longer retry-after fails it)"
    )
    backoff_s: float = Field(default=1.0, ge=0, description="first retry delay without retry-after (doubles)")

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {v!r}")
        return v.rstrip("/")


class OpenAIEndpoint(_HostedEndpoint):
    """An OpenAI-compatible endpoint (OpenAI, vLLM, SGLang's OpenAI server, OpenRouter, ...)."""

    kind: Literal["openai"] = Field(description="selects an OpenAI-compatible API (black-box)")
    api: Literal["chat", "responses"] = Field(default="chat", description="/chat/completions or /responses")
    thinking: bool | None = Field(
        default=None,
        description="chat: sent as chat_template_kwargs.enable_thinking (Qwen-style templates); None: not sent",
    )
    top_logprobs: int | None = Field(
        default=None, ge=0, le=20, description="chat: ask for logprobs (with this many alternatives) when offered"
    )
    tokenizer: str | None = Field(
        default=None,
        description="the served model's tokenizer (HF path/name): with top_logprobs, a turn whose logprob tokens "
        "re-tokenize to exactly one id each is recorded with ids + logprobs, flagged retokenized",
    )


class AnthropicEndpoint(_HostedEndpoint):
    """The Anthropic Messages API (or a server speaking it)."""

    kind: Literal["anthropic"] = Field(description="selects the Anthropic Messages API (black-box)")
    base_url: str = Field(default="https://api.anthropic.com/v1", description="the API root (/messages is appended)")
    api_key_env: str | None = Field(
        default="ANTHROPIC_API_KEY", description="environment variable `farm run` reads the API key from (x-api-key)"
    )
    max_tokens: int | None = Field(default=8192, ge=1, description="max_tokens of every request (required by the API)")
    thinking_budget: int | None = Field(
        default=None, ge=1024, description="extended thinking with this budget_tokens; None: thinking off"
    )
    anthropic_version: str = Field(default="2023-06-01", description="the anthropic-version header sent")


EndpointConfig = Annotated[Union[FarmEndpoint, OpenAIEndpoint, AnthropicEndpoint], Field(discriminator="kind")]
HostedEndpoint = Union[OpenAIEndpoint, AnthropicEndpoint]
