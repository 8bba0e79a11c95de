"""Registry credentials as docker keeps them.

A docker config (``~/.docker/config.json``, or the same JSON in ``FARM_REGISTRY_AUTH``, which
the entry point reads and passes in) holds, per registry, ``auths.<registry>.auth``
(base64 ``user:password``), ``username``/``password``, or ``identitytoken`` (an OAuth
refresh token); ``credHelpers.<registry>`` / ``credsStore`` name a helper
(``docker-credential-<name> get``, the registry on its stdin) that answers with
``{"Username", "Secret"}``. Docker Hub's key is ``https://index.docker.io/v1/``; other
registries are keyed by ``host[:port]``, sometimes with a scheme and a path, all matched.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import RegistryAuthError
from farm.images.reference import DOCKER_HUB

log = logging.getLogger(__name__)

REGISTRY_AUTH_ENV = "FARM_REGISTRY_AUTH"
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io")


@dataclass(frozen=True)
class Credential:
    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)  # an OAuth refresh token (docker login to some registries)

    def basic(self) -> str:
        return base64.b64encode(f"{self.username}:{self.password}".encode()).decode()


def _host_of(key: str) -> str:
    """``https://host:port/v1/`` -> ``host:port``."""
    key = key.split("://", 1)[-1]
    return key.split("/", 1)[0]


class Credentials:
    """Credentials per registry from one or more docker configs (earlier configs win)."""

    def __init__(self, configs: list[dict[str, Any]] | None = None, *, where: list[str] | None = None) -> None:
        self._configs = configs or []
        self._where = where or []
        self._helped: dict[str, Credential | None] = {}

    @classmethod
    def load(cls, docker_config: str | None, env_value: str | None = None) -> Credentials:
        """``env_value`` (the JSON of ``FARM_REGISTRY_AUTH``) first, then the file; a file that
        does not exist is no credentials, one that cannot be read is an error."""
        configs, where = [], []
        if env_value:
            try:
                configs.append(_config(json.loads(env_value)))
            except (ValueError, TypeError) as exc:
                raise RegistryAuthError(f"{REGISTRY_AUTH_ENV} is not a docker config's JSON: {exc}") from None
            where.append(REGISTRY_AUTH_ENV)
        if docker_config:
            path = Path(os.path.expanduser(docker_config))
            if path.is_file():
                try:
                    configs.append(_config(json.loads(path.read_text())))
                except (OSError, ValueError, TypeError) as exc:
                    raise RegistryAuthError(f"docker config {path}: unreadable: {exc}") from None
                where.append(str(path))
        return cls(configs, where=where)

    @property
    def sources(self) -> list[str]:
        """Where credentials were read from (for error messages)."""
        return list(self._where)

    def for_registry(self, registry: str) -> Credential | None:
        keys = _HUB_KEYS if registry in (DOCKER_HUB, "index.docker.io", "registry-1.docker.io") else (registry,)
        for cfg in self._configs:
            for raw, entry in cfg.get("auths", {}).items():
                if _host_of(raw) in {_host_of(k) for k in keys} and isinstance(entry, dict):
                    cred = _from_entry(entry, raw)
                    if cred is not None:
                        return cred
            helpers = cfg.get("credHelpers", {})
            helper = next((helpers[k] for k in helpers if _host_of(k) in {_host_of(x) for x in keys}), None)
            helper = helper or cfg.get("credsStore")
            if helper:
                cred = self._helper(str(helper), keys[0])
                if cred is not None:
                    return cred
        return None

    def _helper(self, helper: str, server: str) -> Credential | None:
        if (helper, server) in self._helped:
            return self._helped[(helper, server)]  # type: ignore[index]
        exe = shutil.which(f"docker-credential-{helper}")
        if exe is None:
            log.warning("registry credentials: helper docker-credential-%s is not installed; asking %s anonymously",
                        helper, server)  # fmt: skip
            return None
        try:
            res = subprocess.run([exe, "get"], input=server, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RegistryAuthError(f"credential helper docker-credential-{helper}: {exc}") from None
        cred = None
        if res.returncode == 0:
            try:
                data = json.loads(res.stdout)
                cred = Credential(username=data.get("Username", ""), password=data.get("Secret", ""))
                if cred.username == "<token>":
                    cred = Credential(identity_token=cred.password)
            except ValueError:
                raise RegistryAuthError(f"credential helper docker-credential-{helper} answered no JSON") from None
        self._helped[(helper, server)] = cred  # type: ignore[index]
        return cred


def _config(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise TypeError("expected a JSON object")
    return data


def _from_entry(entry: dict[str, Any], key: str) -> Credential | None:
    if entry.get("identitytoken"):
        return Credential(identity_token=str(entry["identitytoken"]))
    if entry.get("auth"):
        try:
            user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            raise RegistryAuthError(f"docker config: auths[{key!r}].auth is not base64 of user:password") from None
        return Credential(username=user, password=password)
    if entry.get("username"):
        return Credential(username=str(entry["username"]), password=str(entry.get("password", "")))
    return None
