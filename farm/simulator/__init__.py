"""farm.simulator: a simulated policy worker (the "scripted worker") that speaks SGLang's
native protocol and acts like a policy, the test double for a GPU model server that the
default config, the examples and the tests run; the engine's launchers start it as a process.
Beside it, what a CPU run of a learning policy needs: farm's tiny language model (``lm``), the
train/rollout logprob agreement check (``agreement``), the ``choose`` policy's task family
(``choice_tasks``).

``farm engine serve`` runs one (``engine.mode: simulator``); :class:`ScriptedWorker` + :func:`serve_worker` run
one in process (tests). Policies: ``oracle``, ``noop``, ``replay``, ``scripted``,
``shell``, ``choose``. With a model (a :class:`Scorer`, farm's tiny CPU LM) the worker
scores every token it emits and samples the policy's choices.
"""

from farm.simulator.policies import make_policy
from farm.simulator.policy import Choice, Policy, PolicyReply, PolicyRequest
from farm.simulator.replies import ScriptedPolicy
from farm.simulator.scoring import Scorer
from farm.simulator.server import ScriptedWorker, WorkerSettings, serve_worker

__all__ = [
    "Choice", "Policy", "PolicyReply", "PolicyRequest", "Scorer", "ScriptedPolicy", "ScriptedWorker", "WorkerSettings",
    "make_policy", "serve_worker",
]
