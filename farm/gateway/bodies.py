"""The request bodies the gateway accepts, as pydantic models: one per endpoint.

A model declares a body's envelope, the scalar fields and the lists' shapes; unknown
fields the CLIs send (``metadata``, ``thinking``, ``parallel_tool_calls``,
``prompt_cache_key``, ...) are ignored, never an error. The contents of ``messages`` /
``input`` and ``tools`` stay raw JSON (``list[Any]``): the protocol module translates
them item by item with its :class:`~farm.gateway.canonical.TranslationMemo` (the CLIs
resend the whole history each turn and the memo reuses the translation of every
unchanged message), and validating each block of a 64K-token history into models again
on every turn would cost more CPU than the whole translation (``scripts/bench_bodies.py``).

Strict: ``"1"`` is not a number and ``true`` not a token count. A body that fails is a
400 naming the field (:func:`parse_body`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from farm.gateway.wire import bad_request

Count = Annotated[int, Field(ge=1)]
Stop = str | list[str] | None


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: str | None = None  # None or "": the session's model name
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    include_usage: bool | None = None


class ChatBody(_Body):
    """``POST /v1/chat/completions`` (OpenAI Chat Completions)."""

    messages: list[Any] = Field(min_length=1)
    tools: list[Any] | None = None
    n: Literal[1] | None = None  # one choice per request: a turn records one completion
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None  # the newer name; wins over max_tokens
    stop: Stop = None
    stream_options: StreamOptions | None = None


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    format: dict[str, Any] | None = None


class AnthropicBody(_Body):
    """``POST /v1/messages`` and ``/v1/messages/count_tokens`` (Anthropic Messages)."""

    messages: list[Any] = Field(min_length=1)
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    max_tokens: Count | None = None
    stop_sequences: Stop = None
    output_config: OutputConfig | None = None


class ResponsesBody(_Body):
    """``POST /v1/responses`` (OpenAI Responses)."""

    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    max_output_tokens: Count | None = None


B = TypeVar("B", bound=_Body)


def parse_body(model: type[B], body: Any) -> B:
    """``body`` (already decoded JSON) validated as ``model``; a 400 naming the first bad
    field (``messages: List should have at least 1 item after validation``) otherwise."""
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise bad_request(_describe(exc)) from None


def _describe(exc: ValidationError) -> str:
    """The first error, its field's path first; a union's alternatives are one error."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = [str(p) for p in first["loc"] if not _is_union_branch(p)]
    field = ".".join(loc) or "request body"
    if first["type"] == "missing":
        return f"{field} is required"
    got = first.get("input")
    shown = repr(got) if len(repr(got)) <= 60 else type(got).__name__
    if len(errors) > 1 and errors[1]["loc"][: len(first["loc"]) - 1] == first["loc"][:-1] and _is_union_branch(
        first["loc"][-1]
    ):
        return f"{field}: {_union_expects(errors, first['loc'][:-1])}, got {shown}"
    return f"{field}: {first['msg']}, got {shown}"


def _is_union_branch(part: Any) -> bool:
    """A loc part naming a union alternative (``str``, ``list[str]``, ``int``...) not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool", "none") or "[" in part
                                      or part.startswith(("constrained-", "literal[", "function-")))  # fmt: skip


def _union_expects(errors: list[Any], base: tuple[Any, ...]) -> str:
    branches = [str(e["loc"][len(base)]) for e in errors if e["loc"][: len(base)] == base and len(e["loc"]) > len(base)]
    names = {"str": "a string", "list[str]": "a list of strings", "list[any]": "a list", "int": "an integer",
             "float": "a number", "bool": "a boolean"}  # fmt: skip
    said = list(dict.fromkeys(names.get(b.lower(), b) for b in branches))
    return "must be " + " or ".join(said)
