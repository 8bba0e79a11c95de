"""The URL a sandbox reaches its gateway at, from ``gateway.public_url``'s template.

Every sandbox actor hosts its own gateway, so sandboxes that reach it over the network (E2B
VMs) need one URL per actor: the template names the node (``{node_ip}``, ``{node_id}``,
``{hostname}``) and the gateway's bound port (``{port}``). A sandbox actor fills in its Ray
node's facts (``farm.actors.sandbox``); the gateway fills in its port when it binds, and, used
outside Ray (one process: one gateway), this machine's facts for any node field left.
"""

from __future__ import annotations

import socket

from farm.gateway.config import NODE_FIELDS, fill_url, url_fields


def local_node() -> dict[str, str]:
    """This machine's facts, for a gateway outside Ray: its host name for both name and id,
    and the address it reaches the outside from (no packet is sent: a UDP socket's route)."""
    hostname = socket.gethostname()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: only the routing table is asked
            ip = s.getsockname()[0]
    except OSError:
        ip = "127.0.0.1"
    return {"node_ip": ip, "node_id": hostname, "hostname": hostname}


def public_url(template: str | None, port: int) -> str | None:
    """``template`` with its port (and, if still there, this machine's node facts) filled in."""
    if not template:
        return None
    if url_fields(template) & set(NODE_FIELDS):
        template = fill_url(template, **local_node())
    return fill_url(template, port=str(port))
