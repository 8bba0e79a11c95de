"""A sandbox reaches its own gateway session and nothing else: a real local sandbox with
an isolated network, the gateway's port forwarded to a unix socket that serves one
session; curl inside the sandbox is the client."""

from __future__ import annotations

import json
import os
import shlex
import socket

from gateway_helpers import gateway_env

from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import LocalSandboxConfig, SandboxConfig
from farm.sandboxes.factory import create_sandbox

BODY = json.dumps({"model": "x", "max_tokens": 8, "stream": False, "messages": [{"role": "user", "content": "hi"}]})


def _curl(port: int, key: str | None) -> str:
    auth = f"-H {shlex.quote('x-api-key: ' + key)} " if key else ""
    return (f"curl -s -m 20 -o /dev/null -w '%{{http_code}}' -X POST -H 'content-type: application/json' {auth}"
            f"-d {shlex.quote(BODY)} http://127.0.0.1:{port}/v1/messages")  # fmt: skip


async def test_the_forwarded_port_serves_only_its_own_session(hf_tokenizer, tmp_path) -> None:
    cfg = SandboxConfig(local=LocalSandboxConfig(base_dir=str(tmp_path / "sb")))
    ray_like = socket.socket()
    ray_like.bind(("127.0.0.1", 0))
    ray_like.listen(4)
    async with gateway_env(hf_tokenizer) as env, await create_sandbox(cfg, SandboxSpec()) as sb:
        port = int(env.gw.base_url.rsplit(":", 1)[1])
        mine, other = env.gw.open_session("mine"), env.gw.open_session("other")
        await sb.isolate_network()
        path = await sb.forward_port(port)
        assert path is not None
        await env.gw.serve_session_socket("mine", path)
        env.script("mine", "hello")
        assert (await sb.exec(_curl(port, mine.secret), timeout=60)).stdout == "200"
        # another open session's valid key through this socket: refused, and counted
        assert (await sb.exec(_curl(port, other.secret), timeout=60)).stdout == "401"
        assert (await sb.exec(_curl(port, None), timeout=60)).stdout == "401"
        assert env.gw.stats("mine").foreign_key_refusals == 1
        assert env.gw.stats("other").requests == 0
        # the same key works over the gateway's TCP listener (E2B, tests): nothing else changed
        status, _, _ = await env.post("anthropic", json.loads(BODY), other.secret)
        assert status != 401
        # the host's loopback (the gateway's TCP port is forwarded; a Ray-like port is not)
        probe = f"timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{ray_like.getsockname()[1]}' && echo REACHED"
        assert (await sb.exec(probe)).stdout == ""
        # closing the session closes its socket: the key is dead there too
        await env.gw.close_session("mine")
        assert not os.path.exists(path)
        assert (await sb.exec(_curl(port, mine.secret), timeout=60)).stdout in ("000", "502", "401")
    ray_like.close()
