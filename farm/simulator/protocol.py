"""SGLang's native ``/generate`` wire format, as the scripted worker reads and writes it.

Mirrors SGLang 0.5.x (``GenerateReqInput``, ``SamplingParams``, ``meta_info``):

- request: ``text`` or ``input_ids`` (single prompt), ``sampling_params``,
  ``return_logprob``, ``logprob_start_len``, ``rid``, ``stream``;
- ``finish_reason``: ``{"type": "stop", "matched": <token id | stop string>}``,
  ``{"type": "length", "length": N}``, ``{"type": "abort", "message": ...}``;
- ``output_ids`` always include the matched stop token (only ``text`` is trimmed);
- ``output_token_logprobs``: ``[[logprob, token_id, null], ...]``;
- errors: ``{"object": "error", "message", "type", "param", "code"}``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class SamplingParams(BaseModel):
    """SGLang's sampling parameters; unknown keys are rejected like SGLang does (400)."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int | None = 128
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    custom_params: dict[str, Any] | None = None
    stream_interval: int | None = None
    logit_bias: dict[str, float] | None = None
    sampling_seed: int | None = None

    @property
    def stop_strs(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]

    @field_validator("max_new_tokens")
    @classmethod
    def _non_negative(cls, v: int | None) -> int | None:
        if v is not None and v < 0:
            raise ValueError("max_new_tokens must be at least 0")
        return v


class GenerateRequest(BaseModel):
    """One ``/generate`` body (batched prompts are not supported by the scripted worker)."""

    model_config = ConfigDict(extra="ignore")

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: SamplingParams = Field(default_factory=SamplingParams)
    rid: str | None = None
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False
    stream: bool = False
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0

    @field_validator("sampling_params", mode="before")
    @classmethod
    def _none_is_default(cls, v: Any) -> Any:
        return {} if v is None else v


class RequestError(Exception):
    """A request the worker refuses, with the HTTP status SGLang would use."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def parse_generate(body: Any) -> GenerateRequest:
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    try:
        req = GenerateRequest.model_validate(body)
    except ValidationError as exc:
        raise RequestError(str(exc)) from exc
    if (req.text is None) == (req.input_ids is None):
        raise RequestError("Either text or input_ids should be provided.")
    if req.input_ids is not None and len(req.input_ids) == 0:
        raise RequestError("input_ids cannot be empty.")
    if req.sampling_params.n != 1:
        raise RequestError("the scripted worker supports n=1 only")
    return req


def error_body(message: str, status: int) -> dict[str, Any]:
    """SGLang's ``ErrorResponse``."""
    return {
        "object": "error",
        "message": message,
        "type": HTTPStatus(status).phrase,
        "param": None,
        "code": status,
    }


def finish_stop(matched: int | str) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(message: str) -> dict[str, Any]:
    return {"type": "abort", "message": message}
