"""The ``shell`` policy: plays a script of shell commands through the harness's shell tool.

Where the oracle plays a competent agent, this plays whatever a test wants the policy
to try, through the real CLI's own shell tool (Claude Code's ``Bash``, Codex's
``exec_command``/``shell``, OpenCode's ``bash``): an adversary trying to escape its
sandbox, a reward hacker planting a conftest, a policy that never fixes anything.

The script is JSONL (``engine.simulator.replies_path``), one object per task::

    {"task_id": "demo-wordfreq", "turns": [["cat /etc/passwd", "id -u"], ["rm -rf tests"]]}
    {"task_id": "*", "turns": [["echo hi"]]}                       # any other task

Each turn is a list of commands issued as parallel tool calls in one model turn; after
the last turn the policy answers with a short text and no tool call (the agent ends).
The task is recognised from its instruction text, as the oracle does, so the worker
needs the run's tasks (``tasks_path``); an unknown task uses the ``"*"`` entry.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

from farm.simulator.oracle import find_shell_tool
from farm.simulator.policy import PolicyReply, PolicyRequest
from farm.simulator.prompt import parse_chatml, with_reasoning
from farm.simulator.tasks import TaskIndex
from farm.modeltext.toolcalls import get_format
from farm.tasks.model import Task

ANY_TASK = "*"


def load_shell_script(path: str | os.PathLike[str]) -> dict[str, list[list[str]]]:
    """``task_id -> turns`` from a JSONL script; a bad line raises ValueError naming it."""
    script: dict[str, list[list[str]]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                script[str(obj["task_id"])] = _turns(obj["turns"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{lineno}: not a shell-script line ({exc})") from exc
    return script


def _turns(raw: Any) -> list[list[str]]:
    if not isinstance(raw, list) or not all(isinstance(t, list) and t for t in raw):
        raise TypeError("'turns' must be a list of non-empty lists of commands")
    return [[str(cmd) for cmd in turn] for turn in raw]


class ShellScriptPolicy:
    name = "shell"

    def __init__(self, tasks: Iterable[Task], script: dict[str, Sequence[Sequence[str]]], *,
                 tool_format: str = "hermes") -> None:
        self.index = TaskIndex(tasks)
        self.script = {k: [list(t) for t in v] for k, v in script.items()}
        self.format = get_format(tool_format)

    def _turns_for(self, task: Task | None) -> list[list[str]]:
        if task is not None and task.id in self.script:
            return self.script[task.id]
        return self.script.get(ANY_TASK, [])

    def respond(self, request: PolicyRequest) -> PolicyReply:
        parsed = parse_chatml(request.prompt)
        task, done = None, 0
        for i, m in enumerate(parsed.messages):
            if m.role == "user" and not m.is_tool_result and (found := self.index.find(m.content)) is not None:
                task = found
                done = sum(1 for later in parsed.messages[i + 1:] if later.role == "assistant")
                break
        shell = find_shell_tool(parsed.tools)
        turns = self._turns_for(task)
        if shell is None or done >= len(turns):
            return PolicyReply(text=with_reasoning(parsed, "Nothing more to try.", "I am done."))
        calls = [shell.call(f"call_{done}_{k}", cmd, f"Step {done + 1}.{k + 1}") for k, cmd in enumerate(turns[done])]
        return PolicyReply(text=with_reasoning(parsed, f"Step {done + 1}.", self.format.render(calls)))
