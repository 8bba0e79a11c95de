"""Gateway section: the per-actor model gateway the CLIs talk to."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from farm.engine.config import EngineClientConfig


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SamplingConfig(_Section):
    """Sampling parameters sent to ``/generate`` (the run's, not the CLI's, by default)."""

    temperature: float = Field(default=1.0, ge=0, description="sampling temperature")
    top_p: float = Field(default=1.0, gt=0, le=1, description="nucleus sampling")
    top_k: int = Field(default=-1, description="-1 = off")
    min_p: float = Field(default=0.0, ge=0, le=1, description="0 = off")
    max_new_tokens: int = Field(
        default=16384, ge=1, description="cap per turn; the CLI's max_tokens and the context budget may lower it"
    )
    override_client: bool = Field(
        default=True, description="ignore the CLI's temperature/top_p (RL wants the run's sampling)"
    )
    client_stop_sequences: bool = Field(
        default=True, description="pass the CLI's stop sequences (Anthropic stop_sequences, Chat stop) to SGLang"
    )
    stop_token_ids: list[int] = Field(
        default_factory=list, description="extra stop token ids (SGLang already stops at the model's EOS ids)"
    )


# What a gateway.public_url template may name, filled per sandbox actor (its node's and its own).
NODE_FIELDS = ("node_ip", "node_id", "hostname")
PUBLIC_URL_FIELDS = (*NODE_FIELDS, "port")
_FIELD = re.compile(r"\{([^{}]*)\}")


def url_fields(template: str) -> set[str]:
    """The ``{name}`` fields a public URL template names."""
    return set(_FIELD.findall(template))


def fill_url(template: str, **values: str) -> str:
    """``template`` with the fields given in ``values`` filled in (others left as they are)."""
    return _FIELD.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template)


class GatewayConfig(_Section):
    """The model gateway; the bounds on a request are explained in :mod:`farm.gateway.bounds`."""

    host: str = Field(default="127.0.0.1", description="bind address")
    port: int = Field(default=0, ge=0, description="0 = pick a free port")
    public_url: str | None = Field(
        default=None,
        description="URL the CLI inside the sandbox uses to reach the gateway (E2B: a public tunnel); default "
        "http://<host>:<port>. A template, filled by each sandbox actor: {node_ip}, {node_id}, {hostname} (its Ray "
        "node: IP, id, host name) and {port} (its gateway's bound port), so the sandboxes of every node reach "
        "their own node's gateway (e.g. 'http://{node_ip}:{port}', or 'https://gw-{hostname}.example.com' with one "
        "tunnel per node and gateway.port fixed); a fixed URL serves one sandbox actor only",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to apply_chat_template (e.g. enable_thinking: false)"
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig, description="sampling parameters of every /generate call"
    )
    engine_client: EngineClientConfig = Field(
        default_factory=EngineClientConfig, description="the gateway's /generate client: timeouts, retries, pool"
    )
    max_context_tokens: int = Field(
        default=131072, ge=1, description="default per-session context budget (prompt + output tokens)"
    )
    max_turns: int = Field(default=200, ge=1, description="default per-session limit on main (trained) turns")
    max_body_bytes: int | None = Field(
        default=None, ge=1024,
        description="larger request bodies get 413 before they are read; default: 32 bytes per token of "
        "max_context_tokens, at least 1 MiB (4 MiB at 131,072)",
    )
    max_messages: int = Field(default=10_000, ge=1, description="messages (Responses: input items) per request")
    max_content_blocks: int = Field(default=50_000, ge=1, description="content blocks per request, all messages")
    max_json_depth: int = Field(default=64, ge=4, description="nesting of a tool schema or a tool call's input")
    incremental_render: bool = Field(
        default=True,
        description="render only the new messages of an append-only turn (O(new tokens)); "
        "false = full render + tree.mount every turn (the slow, slime-like baseline)",
    )
    max_match_candidates: int = Field(
        default=16, ge=1, description="recent leaf turns tried as the parent of a request (newest first)"
    )
    first_byte_deadline_s: float = Field(
        default=15.0,
        ge=0,
        description="streaming: a turn that finishes (or fails) within this gets a plain reply with the exact "
        "HTTP status; a longer one gets headers + keepalives and reports failures in-stream",
    )
    keepalive_s: float = Field(default=10.0, gt=0, description="SSE keepalive comment interval while generating")
    close_timeout_s: float = Field(default=10.0, gt=0, description="close_session waits this long for aborts")
    fidelity: Literal["off", "ends", "all"] = Field(
        default="ends",
        description="at session close, compare prompts with a fresh chat-template render (farm.gateway.fidelity): "
        "'ends' = each Sample's context (one full render per Sample), 'all' = every turn, 'off'",
    )
    special_tokens_in_content: Literal["text", "allow"] = Field(
        default="text",
        description="the model's special tokens written inside content (a tool result, a file, user text, tool-call "
        "arguments, the system prompt) are encoded as text: only the chat template's own are control tokens "
        "(farm.gateway.specials); 'allow' encodes them as control tokens (content can then open a turn)",
    )
    budget_ends_session: bool = Field(
        default=True,
        description="a main turn that runs out of the turn, context or output budget ends the session: the CLI "
        "gets a normal end of turn and the rollout is truncated (farm.gateway.budget); false: the reply ends with "
        "the protocol's length stop and the session goes on, as a hosted API answers",
    )
    side_request_markers: list[str] = Field(
        default_factory=lambda: [
            "Generate a concise, sentence-case title",  # Claude Code title request
            "You are a title generator",  # OpenCode title request
        ],
        description="a tool-less request whose system prompt contains one of these is a side request",
    )

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        unknown = sorted(url_fields(value or "") - set(PUBLIC_URL_FIELDS))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join('{' + f + '}' for f in unknown)} in public_url: "
                             f"it may name {', '.join('{' + f + '}' for f in PUBLIC_URL_FIELDS)}")  # fmt: skip
        return value

    @property
    def body_limit(self) -> int:
        """``max_body_bytes``, or its default derived from the context limit: a body over
        32 bytes per token cannot be a prompt that fits (JSON escapes cost at most 6
        bytes per character; a token covers at least one)."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return max(1 << 20, 32 * self.max_context_tokens)
