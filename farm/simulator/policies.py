"""The registry of scripted policies: ``make_policy(name, ...)`` builds one by name.

Kept apart from ``policy`` (the protocol every policy module imports) so the protocol
imports no policy and no policy imports the registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from farm.simulator.policy import Policy, PolicyReply
from farm.simulator.replay import ReplayPolicy
from farm.simulator.replies import ScriptedPolicy, load_replies_jsonl


def make_policy(
    name: str,
    *,
    seed: int = 0,
    tool_format: str = "hermes",
    tasks_path: str | Path | None = None,
    replay_path: str | Path | None = None,
    replies_path: str | Path | None = None,
    replies: Sequence[str | PolicyReply] | None = None,
    oracle_reads: int = 0,
) -> Policy:
    """The policy called ``name`` (``oracle`` | ``noop`` | ``replay`` | ``scripted`` | ``shell`` |
    ``loop`` | ``ramble`` | ``choose``)."""
    # each policy's module only when it is the one asked for: a worker runs one policy
    if name == "oracle":
        # a policy's module loads only when a config chooses it
        from farm.simulator.oracle import OraclePolicy
        from farm.simulator.tasks import load_tasks_jsonl

        tasks = load_tasks_jsonl(tasks_path) if tasks_path else []
        return OraclePolicy(tasks, seed=seed, tool_format=tool_format, reads=oracle_reads)
    if name == "noop":
        # a policy's module loads only when a config chooses it
        from farm.simulator.noop import NoopPolicy

        return NoopPolicy(seed=seed)
    if name == "replay":
        if replay_path is None:
            raise ValueError("policy 'replay' needs a recording (replay_path)")
        return ReplayPolicy.from_jsonl(replay_path)
    if name == "scripted":
        loaded: list[Any] = list(replies or [])
        if replies_path:
            loaded += load_replies_jsonl(replies_path)
        return ScriptedPolicy(loaded)
    if name == "shell":
        # a policy's module loads only when a config chooses it
        from farm.simulator.shell_script import ShellScriptPolicy, load_shell_script
        from farm.simulator.tasks import load_tasks_jsonl

        if replies_path is None:
            raise ValueError("policy 'shell' needs a script (replies_path: JSONL of {task_id, turns})")
        tasks = load_tasks_jsonl(tasks_path) if tasks_path else []
        return ShellScriptPolicy(tasks, load_shell_script(replies_path), tool_format=tool_format)
    if name == "loop":
        # a policy's module loads only when a config chooses it
        from farm.simulator.endless import LoopPolicy

        return LoopPolicy(tool_format=tool_format)
    if name == "ramble":
        # a policy's module loads only when a config chooses it
        from farm.simulator.endless import RamblePolicy

        return RamblePolicy()
    if name == "choose":
        # a policy's module loads only when a config chooses it
        from farm.simulator.choose import ChoosePolicy
        from farm.simulator.tasks import load_tasks_jsonl

        return ChoosePolicy(load_tasks_jsonl(tasks_path) if tasks_path else [], tool_format=tool_format)
    raise ValueError(f"unknown policy {name!r}; known: oracle, noop, replay, scripted, shell, loop, ramble, choose")
