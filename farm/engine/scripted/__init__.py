"""A scripted worker that speaks SGLang's native protocol and acts like a policy.

``farm engine serve`` runs one; :class:`ScriptedWorker` + :func:`serve_worker` run
one in process (tests). Policies: ``oracle``, ``noop``, ``replay``, ``scripted``.
"""

from farm.engine.scripted.policies import make_policy
from farm.engine.scripted.policy import Policy, PolicyReply, PolicyRequest
from farm.engine.scripted.replies import ScriptedPolicy
from farm.engine.scripted.server import ScriptedWorker, WorkerSettings, serve_worker

__all__ = [
    "Policy", "PolicyReply", "PolicyRequest", "ScriptedPolicy", "ScriptedWorker", "WorkerSettings",
    "make_policy", "serve_worker",
]
