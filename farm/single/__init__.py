"""One rollout at a time: ``farm.Rollouts`` (Python), ``farm serve`` (HTTP + SSE) and the
OpenEnv MCP environment, all on the same pipeline, gateway, grading and Samples as
``farm run``."""

from farm.single.handle import RolloutHandle
from farm.single.inline import InlineTask
from farm.single.service import Rollouts

__all__ = ["InlineTask", "RolloutHandle", "Rollouts"]
