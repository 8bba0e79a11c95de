"""A scripted worker that speaks SGLang's native protocol and acts like a policy.

``farm engine serve`` runs one; :class:`ScriptedWorker` + :func:`serve_worker` run
one in process (tests). Policies: ``oracle``, ``noop``, ``replay``, ``scripted``,
``shell``, ``choose``. With a model (a :class:`Scorer`, farm's tiny CPU LM) the worker
scores every token it emits and samples the policy's choices.
"""

from farm.engine.scripted.policies import make_policy
from farm.engine.scripted.policy import Choice, Policy, PolicyReply, PolicyRequest
from farm.engine.scripted.replies import ScriptedPolicy
from farm.engine.scripted.scoring import Scorer
from farm.engine.scripted.server import ScriptedWorker, WorkerSettings, serve_worker

__all__ = [
    "Choice", "Policy", "PolicyReply", "PolicyRequest", "Scorer", "ScriptedPolicy", "ScriptedWorker", "WorkerSettings",
    "make_policy", "serve_worker",
]
