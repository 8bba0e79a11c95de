"""The network half of a local sandbox: the latch to an isolated network and the ports
relayed into it (the mixin ``LocalSandbox`` uses; see ``farm.sandboxes.local``)."""

from __future__ import annotations

import os
import shutil

from farm.errors import SandboxError
from farm.sandboxes.config import LocalSandboxConfig


class LocalNetwork:
    """Mixin for LocalSandbox: needs ``_cfg``, ``_isolated``, ``_net_latched``, ``_forwards``,
    ``_socat``, ``_sock_dir`` and ``_check_open``."""

    _cfg: LocalSandboxConfig
    _isolated: bool
    _net_latched: bool
    _forwards: list[int]
    _socat: str | None
    _sock_dir: str

    def _net_isolated(self) -> bool:
        if self._cfg.network == "host":
            return False
        return self._net_latched or self._cfg.setup_network == "isolated"

    async def isolate_network(self) -> None:
        """From now on every command has only its own loopback (plus forwarded ports)."""
        self._check_open()  # type: ignore[attr-defined] - LocalFiles's
        self._net_latched = True

    async def forward_port(self, port: int) -> str | None:
        """Relay 127.0.0.1:``port`` inside the sandbox to a unix socket; return its host path
        (the caller listens there). None when the sandbox shares the host network."""
        self._check_open()  # type: ignore[attr-defined] - LocalFiles's
        if not self._isolated or self._cfg.network == "host":
            return None
        if self._socat is None:
            self._socat = shutil.which("socat")
            if self._socat is None:
                raise SandboxError("socat not found: install the 'socat' package (apt-get install socat)")
        if port not in self._forwards:
            self._forwards.append(port)
        return self._socket_path(port)

    def _socket_path(self, port: int) -> str:
        """The host's unix socket ``port`` is relayed to (the name ``bwrap.forwarder_prefix`` uses)."""
        return f"{self._sock_dir}/port-{port}.sock"

    def _listened_ports(self) -> list[int]:
        """The forwarded ports a command's jail relays: those whose host socket is there. The
        gateway unlinks a session's socket when it closes, and a relay costs each command a
        socat and its wait (~9 ms of CPU, ~10 ms before the command starts); a connection to
        a port left out is refused rather than accepted and closed."""
        return [p for p in self._forwards if os.path.exists(self._socket_path(p))]

    @property
    def network_policy(self) -> dict[str, str]:
        if not self._isolated or self._cfg.network == "host":
            return {"setup": "host", "agent": "host", "forwarded_ports": ""}
        return {
            "setup": self._cfg.setup_network,
            "agent": "isolated",
            "forwarded_ports": ",".join(map(str, self._forwards)),
        }
