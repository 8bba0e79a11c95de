"""The agent phase's order in ``ActorLayers``: the harness's configure runs before the
session's socket is served, so its command's jail starts no port relay (a local sandbox's
jail relays only a port whose socket is there); the launch comes after it."""

from __future__ import annotations

from farm.config import FarmConfig
from farm.harnesses.plan import HarnessRun
from farm.rollout.actor_layers import ActorLayers


async def test_configure_runs_before_the_sessions_socket_is_served() -> None:
    order: list[str] = []

    class Harness:
        name = "fake"

        async def install(self) -> None:
            order.append("install")

        async def configure(self, sandbox, run) -> str:
            order.append("configure")
            return "plan"

        async def launch(self, sandbox, plan, *, session_idle_s) -> str:
            order.append(f"launch {plan} idle={session_idle_s()}")
            return "ended"

    class Gateway:
        async def serve_session_socket(self, session: str, path: str) -> None:
            order.append(f"serve {session} {path}")

        def session_idle_s(self, session: str) -> float:
            return 1.5 if session == "sess" else -1.0

    layers = ActorLayers(FarmConfig(), "http://engine")
    layers.harness, layers.gateway = Harness(), Gateway()  # type: ignore[assignment]
    layers._secrets["key"] = "sess"
    run = HarnessRun(instruction="x", gateway_url="http://127.0.0.1:1", api_key="key", model="m", workdir="/w",
                     budget_s=10)  # fmt: skip
    assert await layers._run_harness(object(), run, "key", "/run/sock") == "ended"
    assert order == ["install", "configure", "serve sess /run/sock", "launch plan idle=1.5"]
    order.clear()
    assert await layers._run_harness(object(), run, "key", None) == "ended"  # nothing relayed (E2B, host network)
    assert order == ["install", "configure", "launch plan idle=1.5"]
