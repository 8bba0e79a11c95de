"""The ``choose`` policy: the model picks one of a task's candidate fixes.

A task family where the model's own sampled choice decides the reward (what a
learning test needs): each task carries ``K`` candidate patches in
``metadata["candidate_patches"]`` (``farm.simulator.choice_tasks`` makes such tasks from
any tasks with a gold patch: one candidate is the gold patch, the others do not fix
anything). The policy never knows which one is right; the grader does.

1. First turn: a short ``<think>`` naming the task, then ``I apply candidate [``,
   then a :class:`~farm.simulator.policy.Choice`: the worker samples the next
   token (``A``, ``B``, ...) from its model, and the reply goes on with ``].`` and a
   shell tool call that applies that candidate's patch. Any other token: the agent
   says it is not sure and stops (nothing applied: unresolved).
2. After the tool result: a one-line summary, no tool call (the CLI ends).

The rest of each reply is fixed text the model scores. Tool calls use the CLI's own
shell tool and the model's tool-call format, as the oracle writes them.
"""

from __future__ import annotations

import string
from typing import Iterable

from farm.simulator.oracle import find_shell_tool, heredoc
from farm.simulator.policy import Choice, PolicyReply, PolicyRequest
from farm.simulator.prompt import parse_chatml, with_reasoning
from farm.simulator.tasks import TaskIndex
from farm.modeltext.toolcalls import get_format
from farm.tasks.model import Task

CANDIDATES_KEY = "candidate_patches"
PATCH_FILE = "/tmp/farm_candidate.patch"
LABELS = string.ascii_uppercase


def candidate_patches(task: Task) -> list[str]:
    patches = task.metadata.get(CANDIDATES_KEY) or []
    if not isinstance(patches, list) or not all(isinstance(p, str) and p for p in patches):
        raise ValueError(f"task {task.id}: metadata.{CANDIDATES_KEY} must be a list of patches")
    if len(patches) > len(LABELS):
        raise ValueError(f"task {task.id}: at most {len(LABELS)} candidate patches")
    return patches


class ChoosePolicy:
    name = "choose"

    def __init__(self, tasks: Iterable[Task], *, tool_format: str = "hermes") -> None:
        tasks = list(tasks)
        for task in tasks:
            candidate_patches(task)  # a malformed task fails at start, not mid-run
        self.index = TaskIndex(tasks)
        self.format = get_format(tool_format)

    def respond(self, request: PolicyRequest) -> PolicyReply:
        parsed = parse_chatml(request.prompt)
        task, done = None, 0
        for i, m in enumerate(parsed.messages):
            if m.role == "user" and not m.is_tool_result and (found := self.index.find(m.content)) is not None:
                task = found
                done = sum(1 for later in parsed.messages[i + 1:] if later.role == "assistant")
                break
        shell = find_shell_tool(parsed.tools)
        patches = candidate_patches(task) if task is not None else []
        if task is None or shell is None or not patches:
            return PolicyReply(text=with_reasoning(parsed, "I cannot act on this request.",
                                                   "I have no candidate fixes to choose from here."))
        if done > 0:
            return PolicyReply(text=with_reasoning(parsed, "The chosen fix is applied; time to summarize.",
                                                   f"I applied one of the candidate fixes for {task.id}. Done."))
        options = []
        for label, patch in zip(LABELS, patches):
            cmd = (heredoc(PATCH_FILE, patch)
                   + f"git apply --whitespace=nowarn {PATCH_FILE} || patch -p1 --forward < {PATCH_FILE}")
            call = shell.call("call_0", cmd, f"Apply candidate fix {label}")
            options.append((label, "].\n" + self.format.render([call])))
        why = f"{len(patches)} candidate fixes for {task.id}; exactly one of them is right."
        return PolicyReply(
            text=with_reasoning(parsed, why, "I apply candidate ["),
            choice=Choice(options=tuple(options), otherwise="]. I am not sure which candidate is right; I stop here."),
        )
