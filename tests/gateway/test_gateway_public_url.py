"""gateway.public_url as a template: every gateway is reached at its own URL (its node's
facts and its bound port), so the E2B sandboxes of every sandbox actor reach their own."""

from __future__ import annotations

import pytest
from gateway_helpers import gateway_env
from pydantic import ValidationError

from farm.gateway.config import GatewayConfig, fill_url, url_fields
from farm.gateway.public_url import local_node, public_url

BODY = {"model": "x", "max_tokens": 8, "stream": False, "messages": [{"role": "user", "content": "hi"}]}


async def test_each_gateway_is_reached_at_its_own_url(hf_tokenizer) -> None:
    """Two gateways of one template: each URL is its own bound port on this node's address,
    and a request sent to it reaches that gateway's session."""
    template = "http://{node_ip}:{port}"
    async with gateway_env(hf_tokenizer, host="0.0.0.0", public_url=template) as one, \
            gateway_env(hf_tokenizer, host="0.0.0.0", public_url=template) as two:  # fmt: skip
        urls = [one.gw.base_url, two.gw.base_url]
        ip = local_node()["node_ip"]
        assert len(set(urls)) == 2 and all(u.startswith(f"http://{ip}:") for u in urls), urls
        for env in (one, two):
            session = env.gw.open_session("s")
            env.script("s", "hello")
            status, text, _ = await env.post("anthropic", BODY, session.secret)  # to env.gw.base_url
            assert status == 200 and "hello" in text, text
            assert env.gw.stats("s").requests == 1


def test_node_fields_filled_by_the_actor_stay_and_the_port_is_the_gateways() -> None:
    filled = fill_url("https://{node_id}.gw.example.com:{port}/", node_id="4f1c")  # as a sandbox actor fills it
    assert filled == "https://4f1c.gw.example.com:{port}/"
    assert public_url(filled, 41234) == "https://4f1c.gw.example.com:41234/"
    assert public_url("https://tunnel.example.com", 41234) == "https://tunnel.example.com"  # a fixed URL: as it is
    assert public_url(None, 1) is None
    assert public_url("http://{hostname}:{port}", 7) == f"http://{local_node()['hostname']}:7"  # outside Ray
    assert url_fields("http://{node_ip}:{port}/{node_id}") == {"node_ip", "port", "node_id"}


def test_an_unknown_field_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValidationError, match=r"unknown field\(s\) \{nodeip\} in public_url: it may name \{node_ip\}"):
        GatewayConfig(public_url="http://{nodeip}:{port}")
