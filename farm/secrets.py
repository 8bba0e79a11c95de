"""The keys a run needs and never writes anywhere: one object, not a keyword argument per key
threaded through every constructor from the entry point to the sandbox.

``RunSecrets.from_environ(cfg, os.environ)`` is read once, by the entry point (``farm run``,
``farm rollout``, ``farm.Farm``, ``farm.Rollouts``), and travels to the sandbox actors as
one value: its fields never appear in a repr, a log line, ``run_config.yaml`` or a Ray
dashboard view of an actor's arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from farm.config import FarmConfig, endpoint_api_key
from farm.errors import ConfigError

E2B_KEY_ENV = "E2B_API_KEY"
REGISTRY_AUTH_ENV = "FARM_REGISTRY_AUTH"  # a docker config's JSON: credentials for image registries


@dataclass(frozen=True)
class RunSecrets:
    """``e2b_api_key``: the E2B cloud's (``sandbox.backend: e2b``); ``endpoint_api_key``: the
    hosted endpoint's that ``cfg.endpoint`` names (black-box runs, from its ``api_key_env``)."""

    e2b_api_key: str | None = field(default=None, repr=False)
    endpoint_api_key: str | None = field(default=None, repr=False)
    registry_auth: str | None = field(default=None, repr=False)  # FARM_REGISTRY_AUTH (farm.images.auth)

    @classmethod
    def from_environ(cls, cfg: FarmConfig, environ: Mapping[str, str]) -> RunSecrets:
        """The keys ``cfg`` needs, from ``environ``; a ConfigError naming the variable when
        one it needs is unset (before anything starts)."""
        e2b = environ.get(E2B_KEY_ENV) or None
        if cfg.sandbox.backend == "e2b" and not e2b:
            raise ConfigError(f"sandbox.backend is e2b but {E2B_KEY_ENV} is not set")
        return cls(e2b_api_key=e2b, endpoint_api_key=endpoint_api_key(cfg, environ),
                   registry_auth=environ.get(REGISTRY_AUTH_ENV) or None)  # fmt: skip

    def __repr__(self) -> str:
        said = {"e2b_api_key": self.e2b_api_key, "endpoint_api_key": self.endpoint_api_key,
                "registry_auth": self.registry_auth}  # fmt: skip
        return "RunSecrets(" + ", ".join(f"{k}={'set' if v else 'unset'}" for k, v in said.items()) + ")"
