"""Policies that never stop, so that only a budget ends them (the fault suite's "the policy
never stops"):

- ``loop`` never ends its work: every turn it calls the CLI's shell tool again (a
  harmless look around the repository) and never gives a final answer. The turn budget
  (``rollout.max_turns``) or the context window ends it.
- ``ramble`` never ends its turn: it thinks aloud and never writes EOS, so each turn runs
  until the output budget (``max_new_tokens``) cuts it.

A request without a shell tool (a title side request) gets a short plain answer.
"""

from __future__ import annotations

from farm.simulator.oracle import find_shell_tool
from farm.simulator.policy import PolicyReply, PolicyRequest
from farm.simulator.prompt import parse_chatml, with_reasoning
from farm.modeltext.toolcalls import get_format

_LOOK = ("ls", "git status --short", "git log --oneline -3", "ls -la")


class LoopPolicy:
    name = "loop"

    def __init__(self, *, tool_format: str = "hermes") -> None:
        self.format = get_format(tool_format)

    def respond(self, request: PolicyRequest) -> PolicyReply:
        parsed = parse_chatml(request.prompt)
        shell = find_shell_tool(parsed.tools)
        if shell is None:
            return PolicyReply(text=with_reasoning(parsed, "", "Looking around the repository"))
        n = len(parsed.prior_assistant_turns)
        call = shell.call(f"call_{n}", _LOOK[n % len(_LOOK)], "Look around")
        return PolicyReply(text=with_reasoning(parsed, "I am not sure yet; let me look once more.",
                                               self.format.render([call])))  # fmt: skip


class RamblePolicy:
    name = "ramble"

    def respond(self, request: PolicyRequest) -> PolicyReply:
        parsed = parse_chatml(request.prompt)
        if not parsed.tools:
            return PolicyReply(text=with_reasoning(parsed, "", "Rambling about the repository"))
        # no EOS: the worker repeats the text until max_new_tokens (SGLang's length finish)
        return PolicyReply(text="Let me think about this a little longer. ", eos=False)
