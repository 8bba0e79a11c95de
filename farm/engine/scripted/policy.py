"""The policy protocol: what a scripted model wants to say for one prompt.

A policy returns a decision (:class:`PolicyReply`); the server carries it out with
SGLang's stop rules, latency and faults. Policies are deterministic per seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from farm.engine.scripted.protocol import SamplingParams


@dataclass(eq=False)
class PolicyRequest:
    """One ``/generate`` call as a policy sees it."""

    rid: str
    input_ids: Sequence[int]
    sampling: SamplingParams
    routing_key: str | None = None
    decode: Callable[[Sequence[int]], str] = field(default=lambda ids: "", repr=False)

    @cached_property
    def prompt(self) -> str:
        """The prompt text, special tokens included (decoded once, on demand)."""
        return self.decode(self.input_ids)


@dataclass(frozen=True, slots=True)
class PolicyReply:
    """``text`` is tokenized (or ``output_ids`` used verbatim); ``eos`` appends the
    tokenizer's EOS. Without EOS the model rambles on until ``max_new_tokens``."""

    text: str = ""
    output_ids: tuple[int, ...] | None = None
    eos: bool = True


class Policy(Protocol):
    name: str

    def respond(self, request: PolicyRequest) -> PolicyReply: ...


def make_policy(
    name: str,
    *,
    seed: int = 0,
    tool_format: str = "hermes",
    tasks_path: str | Path | None = None,
    replay_path: str | Path | None = None,
    replies_path: str | Path | None = None,
    replies: Sequence[str | PolicyReply] | None = None,
) -> Policy:
    """The policy called ``name`` (``oracle`` | ``noop`` | ``replay`` | ``scripted`` | ``shell``)."""
    if name == "oracle":
        from farm.engine.scripted.oracle import OraclePolicy
        from farm.engine.scripted.tasks import load_tasks_jsonl

        tasks = load_tasks_jsonl(tasks_path) if tasks_path else []
        return OraclePolicy(tasks, seed=seed, tool_format=tool_format)
    if name == "noop":
        from farm.engine.scripted.noop import NoopPolicy

        return NoopPolicy(seed=seed)
    if name == "replay":
        from farm.engine.scripted.replay import ReplayPolicy

        if replay_path is None:
            raise ValueError("policy 'replay' needs a recording (replay_path)")
        return ReplayPolicy.from_jsonl(replay_path)
    if name == "scripted":
        from farm.engine.scripted.replies import ScriptedPolicy, load_replies_jsonl

        loaded: list[Any] = list(replies or [])
        if replies_path:
            loaded += load_replies_jsonl(replies_path)
        return ScriptedPolicy(loaded)
    if name == "shell":
        from farm.engine.scripted.shell_script import ShellScriptPolicy, load_shell_script
        from farm.engine.scripted.tasks import load_tasks_jsonl

        if replies_path is None:
            raise ValueError("policy 'shell' needs a script (replies_path: JSONL of {task_id, turns})")
        tasks = load_tasks_jsonl(tasks_path) if tasks_path else []
        return ShellScriptPolicy(tasks, load_shell_script(replies_path), tool_format=tool_format)
    raise ValueError(f"unknown policy {name!r}; known: oracle, noop, replay, scripted, shell")
