"""The ``noop`` policy: answers politely and does nothing (a failing baseline)."""

from __future__ import annotations

import random

from farm.simulator.policy import PolicyReply, PolicyRequest
from farm.simulator.prompt import parse_chatml, with_reasoning

_ANSWERS = (
    "I have read the request. I will not make any changes.",
    "Thanks for the task. I am leaving the code as it is.",
    "Understood. No changes from me this time.",
)


class NoopPolicy:
    name = "noop"

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = seed

    def respond(self, request: PolicyRequest) -> PolicyReply:
        parsed = parse_chatml(request.prompt)
        rng = random.Random(f"{self.seed}:{len(request.input_ids)}")
        return PolicyReply(text=with_reasoning(parsed, "Nothing to do.", rng.choice(_ANSWERS)))
