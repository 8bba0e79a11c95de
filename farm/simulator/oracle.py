"""The ``oracle`` policy: a competent agent that knows each task's solution.

It reads the rendered prompt back (:mod:`farm.simulator.prompt`), recognises the
task by its instruction text and the harness's shell tool by the tool schemas, and
works through the task one model turn per completed tool round-trip:

1. look at the repository: two *parallel* calls (``git status``, ``ls``), then ``reads``
   more turns of reading (the files the fix touches, the log, a search: 0 by default), so a
   benchmark can give its rollouts the length of a real agent's;
2. apply the gold patch (written to a file, then ``git apply``, ``patch`` as fallback)
   or run the solution commands;
3. run the task's test command;
4. finish with a short summary and no tool call.

Steps without material (no gold patch / solution, no test command) are skipped. An
unknown task, or a prompt without a shell tool, gets a polite answer without tools.
Tool calls are written in the model's own format (``farm.modeltext.toolcalls``), after a
short ``<think>`` block, so the gateway's parser reads them back like a real model's.
"""

from __future__ import annotations

import random
import re
import shlex
from dataclasses import dataclass
from typing import Iterable

from farm.simulator.policy import PolicyReply, PolicyRequest
from farm.simulator.prompt import ParsedPrompt, ToolSpec, parse_chatml, with_reasoning
from farm.simulator.tasks import TaskIndex
from farm.modeltext.toolcalls import ToolCall, get_format
from farm.tasks.model import Task

# Shell tools by harness, in preference order: Claude Code, Codex, OpenCode.
SHELL_TOOL_NAMES = ("Bash", "exec_command", "shell_command", "shell", "bash")
PATCH_FILE = "/tmp/farm_gold.patch"


@dataclass(frozen=True, slots=True)
class ShellTool:
    """How to call the harness's shell tool."""

    name: str
    arg: str  # "command" (Claude Code, OpenCode, Codex shell) or "cmd" (Codex exec_command)
    argv: bool  # the command is an argv array (Codex's legacy ``shell``)
    describe: bool  # the schema has a ``description`` argument

    def call(self, call_id: str, command: str, description: str) -> ToolCall:
        args: dict[str, object] = {self.arg: ["bash", "-lc", command] if self.argv else command}
        if self.describe:
            args["description"] = description
        return ToolCall(id=call_id, name=self.name, arguments=args)


def find_shell_tool(tools: Iterable[ToolSpec]) -> ShellTool | None:
    by_name = {t.name: t for t in tools}
    for name in SHELL_TOOL_NAMES:
        spec = by_name.get(name)
        if spec is None:
            continue
        props = spec.properties
        arg = "cmd" if "cmd" in props else "command"
        kind = (props.get(arg) or {}).get("type")
        return ShellTool(name=name, arg=arg, argv=kind == "array", describe="description" in props)
    return None


def heredoc(path: str, body: str) -> str:
    tag = "FARM_PATCH_EOF"
    while tag in body:
        tag += "_"
    if not body.endswith("\n"):
        body += "\n"
    return f"cat > {path} <<'{tag}'\n{body}{tag}\n"


def _one_line(text: str, limit: int = 120) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _last_line(text: str | None) -> str:
    if not text:
        return ""
    body = text.replace("<tool_response>", "").replace("</tool_response>", "")
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    return _one_line(lines[-1], 200) if lines else ""


def _read_command(task: Task, i: int) -> str:
    """The ``i``-th reading turn: the files the gold patch touches in turn, then the log and a search."""
    files = re.findall(r"^\+\+\+ b/(\S+)", task.gold_patch or "", re.M)
    kinds = [f"sed -n '1,80p' {shlex.quote(f)}" for f in files] + ["git log --oneline -10", "grep -rn 'def ' . | head -40"]
    return kinds[i % len(kinds)]


class OraclePolicy:
    name = "oracle"

    def __init__(self, tasks: Iterable[Task], *, seed: int = 0, tool_format: str = "hermes", reads: int = 0) -> None:
        if reads < 0:
            raise ValueError(f"oracle reads must be >= 0, got {reads}")
        self.index = TaskIndex(tasks)
        self.seed = seed
        self.format = get_format(tool_format)
        self.reads = reads

    # -- decisions -------------------------------------------------------------
    def _locate(self, parsed: ParsedPrompt) -> tuple[Task | None, int]:
        """The task and how many assistant turns already answered it."""
        for i, m in enumerate(parsed.messages):
            if m.role != "user" or m.is_tool_result:
                continue
            task = self.index.find(m.content)
            if task is not None:
                done = sum(1 for later in parsed.messages[i + 1:] if later.role == "assistant")
                return task, done
        return None, 0

    def plan(self, task: Task) -> list[str]:
        steps = ["look", *(f"read.{i}" for i in range(self.reads))]
        if task.gold_patch or task.solution_commands:
            steps.append("apply")
        if task.test_command:
            steps.append("test")
        return steps

    def _calls(self, step: str, task: Task, shell: ShellTool, n: int) -> tuple[str, list[ToolCall]]:
        cid = f"call_{n}"
        if step == "look":
            return (
                "Let me look at the repository first: its status and its files.",
                [shell.call(f"{cid}_0", "git status", "Show working tree status"),
                 shell.call(f"{cid}_1", "ls", "List files in current directory")],
            )
        if step.startswith("read."):
            return "Let me read more before I change anything.", [shell.call(cid, _read_command(task, int(step[5:])),
                                                                                "Read the code")]
        if step == "apply":
            if task.gold_patch:
                cmd = (heredoc(PATCH_FILE, task.gold_patch)
                       + f"git apply --whitespace=nowarn {PATCH_FILE} || patch -p1 --forward < {PATCH_FILE}")
                why = "I know what to change; I will write the fix as a patch and apply it."
            else:
                cmd = "\n".join(task.solution_commands)
                why = "I know what to change; I will run the commands that make the fix."
            return why, [shell.call(cid, cmd, "Apply the fix")]
        assert task.test_command
        return ("Now I will run the tests to check the fix.",
                [shell.call(cid, task.test_command, "Run the tests")])

    def respond(self, request: PolicyRequest) -> PolicyReply:
        parsed = parse_chatml(request.prompt)
        task, done = self._locate(parsed)
        shell = find_shell_tool(parsed.tools)
        if task is None or shell is None:
            missing = "a task I know" if task is None else "a shell tool I can use"
            text = ("I'm sorry, I can't work on this here: I could not find " + missing
                    + ". Could you give me more details?")
            return PolicyReply(text=with_reasoning(parsed, "I cannot act on this request.", text))
        rng = random.Random(f"{self.seed}:{task.id}:{done}")
        steps = self.plan(task)
        if done < len(steps):
            why, calls = self._calls(steps[done], task, shell, done)
            if rng.random() < 0.5:
                why = f"Task: {_one_line(task.instruction, 80)} {why}"
            return PolicyReply(text=with_reasoning(parsed, why, self.format.render(calls)))
        result = _last_line(parsed.last_tool_result())
        summary = f"I fixed the issue in task {task.id}"
        if task.gold_patch or task.solution_commands:
            summary += " by applying the change"
        if task.test_command:
            summary += f" and ran `{task.test_command}`"
            if result:
                summary += f" (last output line: {result})"
        summary += "."
        closing = rng.choice(["The work is done.", "Everything is in place.", "Done."])
        return PolicyReply(text=with_reasoning(parsed, "The fix is in and tested; time to summarize.",
                                               f"{summary} {closing}"))
