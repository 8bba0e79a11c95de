"""ActorLayers: the real layers behind the rollout pipeline, for one sandbox actor (its
composition root: engine client, gateway, harness, sandboxes, environments, grading).

Holds what an actor's rollouts share: the model gateway (with its engine client and
tokenizer), the sandbox-create limiter, the task runtime (repository cache). Each
method is one phase of ``farm.rollout.pipeline``; they raise the layers' own errors
and the pipeline maps them to a status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from farm.config import FarmConfig
from farm.errors import PatchApplyError
from farm.grading import grade, grading_spec
from farm.harnesses.plan import HarnessRun
from farm.rollout.model import RolloutSpec
from farm.rollout.pipeline import AgentEnd, Grade
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.sandboxes.config import DEFAULT_PATH
from farm.sandboxes.limiter import SandboxLimiter
from farm.sandboxes.pool import SandboxPool
from farm.secrets import RunSecrets
from farm.workspace.capture import capture_diff
from farm.workspace.prepare import prepare_workspace
from farm.harnesses import make_harness
from farm.tasks.runtime import TaskRuntime
from farm.sandboxes.factory import make_limiter
from farm.modeltext.tokenizer import load_tokenizer
from farm.sandboxes.factory import create_sandbox
from farm.harnesses.follow import follow_lines

if TYPE_CHECKING:
    from farm.engine.client import EngineClient
    from farm.gateway.gateway import Gateway
    from farm.harnesses.base import Harness
    from farm.tasks.runtime import TaskRuntime

log = logging.getLogger(__name__)


def make_actor_limiter(cfg: FarmConfig) -> SandboxLimiter:
    """One limiter per actor, shared by its rollouts (E2B: its plan's rate/concurrency)."""
    limiter = make_limiter(cfg.sandbox)
    if limiter is not None:
        return limiter
    rate = cfg.rollout.sandbox_create_rate
    return SandboxLimiter(rate, max(1, int(rate)), cfg.rollout.sandbox_create_concurrency)


def make_actor_pool(cfg: FarmConfig, create: Callable[[SandboxSpec], Any], limiter: SandboxLimiter) -> SandboxPool:
    """The actor's warm sandboxes (``sandbox.pool``); a background create leaves one live slot free."""
    return SandboxPool(create, cfg.sandbox.pool, has_room=lambda: limiter.in_use + 1 < limiter.max_concurrent)


class ActorLayers:
    def __init__(
        self,
        cfg: FarmConfig,
        engine_url: str,
        *,
        secrets: RunSecrets | None = None,
        on_sandbox_created: Callable[[float], None] | None = None,
        on_sandbox: Callable[[Sandbox], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.engine_url = engine_url
        self.secrets = secrets or RunSecrets()  # read by the entry point; never stored
        self.on_sandbox_created = on_sandbox_created  # hears each create's seconds (the actor's metric)
        self.on_sandbox = on_sandbox  # hears each new sandbox (what a bench accounts per sandbox)
        self.limiter = make_actor_limiter(cfg)
        self.pool = make_actor_pool(cfg, self._create, self.limiter)
        # made by ``start`` (None before it: a failed start leaves what it made for ``stop``)
        self.gateway: Gateway | None = None
        self.engine: EngineClient | None = None  # None also when a hosted endpoint serves the CLIs
        self.runtime: TaskRuntime | None = None
        self.harness: Harness | None = None
        self.gateway_url = ""
        self._sandboxes: set[Sandbox] = set()
        self._secrets: dict[str, str] = {}
        self._excludes: dict[str, list[str]] = {}
        # rollout id -> who hears its session's turns (farm.single's live events)
        self.observers: dict[str, Callable[[str, dict[str, Any]], None]] = {}

    async def start(self) -> str:
        # imported here, not with this module: the engine client, the gateway (its HTTP
        # server, the renderers) and the tokenizer take seconds to import; only a started
        # actor needs them
        from farm.engine.client import EngineClient
        from farm.envs.provider import provider_for
        from farm.gateway.gateway import Gateway

        e = self.cfg.engine
        self.runtime = await asyncio.to_thread(TaskRuntime.from_config, self.cfg.tasks)
        self.runtime.envs = provider_for(
            self.cfg.envs, self.cfg.sandbox, self.runtime, self._create, e2b_api_key=self.secrets.e2b_api_key,
            registry_auth=self.secrets.registry_auth,
        )
        self.harness = make_harness(self.cfg.harness)
        if not self.cfg.mode.needs_engine:  # a hosted endpoint serves the CLIs: no tokenizer (farm.gateway.blackbox)
            ep = self.cfg.active_endpoint
            ep_tok = getattr(ep, "tokenizer", None)
            tok = await asyncio.to_thread(load_tokenizer, ep_tok, e.tokenizer_cache_dir) if ep_tok else None
            self.gateway = Gateway.for_endpoint(self.cfg.gateway, self.cfg.endpoint, ep, self.secrets.endpoint_api_key,
                                                model_name=e.model_name, tokenizer=tok)  # fmt: skip
            self.gateway_url = await self.gateway.start()
            return self.gateway_url
        tokenizer = await asyncio.to_thread(load_tokenizer, e.tokenizer, e.tokenizer_cache_dir)
        client_cfg = self.cfg.gateway.engine_client
        if self.cfg.engine.client_routing() is not None:  # MoE routing replay: ask for and check the experts
            client_cfg = client_cfg.model_copy(update={"routed_experts": self.cfg.engine.client_routing()})
        self.engine = EngineClient(self.engine_url, client_cfg)
        self.gateway = Gateway(self.cfg.gateway, tokenizer, self.engine, e.tool_parser, model_name=e.model_name)
        self.gateway_url = await self.gateway.start()
        return self.gateway_url

    async def stop(self) -> None:
        """Close the pool, open sandboxes, the gateway (closing its sessions) and the engine client."""
        await self.pool.close()
        await asyncio.gather(*(sb.close() for sb in list(self._sandboxes)), return_exceptions=True)
        self._sandboxes.clear()
        if self.gateway is not None:
            await self.gateway.stop()
        if self.engine is not None:
            await self.engine.close()
        if self.runtime is not None and self.runtime.envs is not None:
            await self.runtime.envs.close()  # its registry connections

    # --- phases ---------------------------------------------------------------
    def _labels(self, spec: RolloutSpec, purpose: str) -> dict[str, str]:
        return {
            "run_id": spec.run_id,
            "rollout_id": spec.rollout_id,
            "task_id": spec.task.id,
            "attempt": str(spec.attempt),
            "purpose": purpose,
        }

    async def create_sandbox(self, spec: RolloutSpec, purpose: str, sb_spec: SandboxSpec | None = None) -> Sandbox:
        if sb_spec is None:
            cli = await self.harness.host_prefix() if purpose == "agent" and self.harness is not None else None
            sb_spec = SandboxSpec(
                labels=self._labels(spec, purpose),
                image=spec.task.image,
                timeout_s=self.cfg.rollout.lifetime_s,
                ro_binds=[str(cli)] if cli is not None else [],  # the CLI runs from the host cache
                # (or, where the root is a container image, a relinked copy of it: farm.sandboxes.hostrt)
                host_programs=[str(await self.harness.install())] if cli is not None else [],
            )
        sb_spec = await self.runtime.sandbox_spec(spec.task, sb_spec)  # interpreter, environment snapshot
        return await self.pool.acquire(sb_spec)  # warm when sandbox.pool.size > 0, else created now

    async def _create(self, sb_spec: SandboxSpec) -> Sandbox:
        t0 = time.monotonic()
        sb = await create_sandbox(self.cfg.sandbox, sb_spec, limiter=self.limiter, e2b_api_key=self.secrets.e2b_api_key)
        if self.on_sandbox_created is not None:
            self.on_sandbox_created(time.monotonic() - t0)
        if self.on_sandbox is not None:
            self.on_sandbox(sb)
        self._sandboxes.add(sb)
        sb.add_close_callback(lambda: self._sandboxes.discard(sb))
        return sb

    async def prepare(self, sandbox: Sandbox, spec: RolloutSpec) -> Any:
        # the scratch dir is left to the capture's command: on a snapshot's view no command runs here
        return await prepare_workspace(sandbox, spec.task, self.runtime, make_scratch=False)

    async def open_session(self, spec: RolloutSpec) -> str:
        handle = self.gateway.open_session(spec.rollout_id, max_turns=self.cfg.rollout.max_turns,
                                           observer=self.observers.get(spec.rollout_id))
        self._secrets[handle.secret] = handle.session_id
        return handle.secret

    async def run_agent(
        self, sandbox: Sandbox, spec: RolloutSpec, secret: str, budget_s: float, workspace: Any
    ) -> AgentEnd:
        gateway_url, socket = await self._isolate(sandbox)
        self.gateway.set_deadline(self._secrets[secret], time.monotonic() + budget_s)
        run = HarnessRun(
            instruction=spec.task.instruction,
            gateway_url=gateway_url,
            api_key=secret,
            model=self.cfg.engine.model_name,
            workdir=workspace.workdir,
            budget_s=budget_s,
            env=self._agent_env(spec.task),
        )
        running = self._run_harness(sandbox, run, secret, socket)
        end = await self._until_stuck(self._followed(running, sandbox, spec), sandbox, secret)
        self._excludes[spec.rollout_id] = list(end.diff_excludes)
        return end

    async def _run_harness(self, sandbox: Sandbox, run: HarnessRun, secret: str, socket: str | None) -> Any:
        """The harness's install, configure and launch, with the session's socket served in
        between: configure's command needs no gateway, and a jail relays only a port whose
        socket is there (``farm.sandboxes.local_net``), so it starts no relay; the launch's
        command asks the gateway before the CLI."""
        session = self._secrets[secret]
        await self.harness.install()
        plan = await self.harness.configure(sandbox, run)
        if socket is not None:
            await self.gateway.serve_session_socket(session, socket)
        return await self.harness.launch(sandbox, plan, session_idle_s=lambda: self.gateway.session_idle_s(session))

    async def _followed(self, running: Any, sandbox: Sandbox, spec: RolloutSpec) -> Any:
        """``running`` (the harness run), its CLI's stdout lines told to the rollout's
        observer as they are written (when someone watches it: farm.single)."""
        observer = self.observers.get(spec.rollout_id)
        if observer is None:
            return await running

        stop = asyncio.Event()
        path = f"{self.harness.scratch_dir(sandbox)}/stdout.jsonl"
        follower = asyncio.ensure_future(
            follow_lines(sandbox, path, lambda line: observer("agent_output", {"line": line}), stop))
        try:
            return await running
        finally:
            stop.set()
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                follower.cancel()  # aborted / timed out: no last read from a sandbox being torn down
            else:
                try:
                    await asyncio.wait_for(follower, 10)
                except Exception:  # noqa: BLE001 - live output is best effort
                    log.warning("following %s's output failed", spec.rollout_id, exc_info=True)

    async def _until_stuck(self, running: Any, sandbox: Sandbox, secret: str) -> AgentEnd:
        """How the harness run ended; or the CLI found stuck and killed: no model request
        in flight and no tool running for ``rollout.agent_idle_timeout_s``. A policy's own
        long tool call keeps a process busy, a model call keeps a request in flight: neither
        is stuck. Only where the sandbox can tell (local). Where the endpoint can fail a session
        (black-box mode: a hosted endpoint refused the key, retries spent), also that: the CLI
        is killed at once, not left retrying."""
        limit = self.cfg.rollout.agent_idle_timeout_s
        task = asyncio.ensure_future(running)
        watch_idle = bool(limit)  # a sandbox that cannot count its busy processes (E2B) never finds one idle
        watch_failure = self.cfg.mode.endpoint_fails_sessions
        if not watch_idle and not watch_failure:
            return AgentEnd.from_harness(await task)
        session = self._secrets[secret]
        poll = 0.5 if watch_failure else min(5.0, (limit or 20.0) / 4)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=poll)
                if done:
                    return AgentEnd.from_harness(task.result())
                failure = self.gateway.session_failure(session)  # None for a session no endpoint can fail
                if failure is not None:  # (Failure, reason)
                    return AgentEnd.endpoint_failed(*failure)
                if not watch_idle:
                    continue
                assert limit is not None
                idle = self.gateway.session_idle_s(session)
                if idle >= limit and await asyncio.to_thread(sandbox.busy_processes) == 0:
                    return AgentEnd.stuck(f"{self.harness.name} was stuck: no model request in flight and no tool "
                                          f"running for {idle:.0f} s (rollout.agent_idle_timeout_s); CLI killed")
        finally:
            if not task.done():
                task.cancel()  # the runner kills the CLI's process tree on the way out
                await asyncio.gather(task, return_exceptions=True)

    async def _isolate(self, sandbox: Sandbox) -> tuple[str, str | None]:
        """Cut the agent sandbox off every network but its own gateway session: the network
        latch, then the gateway's port relayed to a unix socket (the caller serves only this
        session there). Returns the gateway URL as the sandbox sees it (E2B, or a local
        sandbox on the host network: the gateway's URL as it is) and the socket's path (None:
        no relay)."""
        await sandbox.isolate_network()
        port = urlsplit(self.gateway_url).port
        if port is None:
            return self.gateway_url, None
        path = await sandbox.forward_port(port)
        if path is None:
            return self.gateway_url, None
        return f"http://127.0.0.1:{port}", path

    def _agent_env(self, task: Any) -> dict[str, str]:
        """The task's interpreter first on the agent's PATH, as the grader has it.

        Without it the agent's own ``python -m pytest`` runs a python without the
        task's test dependencies (or none at all) while the grader's run passes.
        """
        prefix = self.runtime.path_prefix_for(task) if self.runtime is not None else None
        if not prefix:
            return {}
        base = self.cfg.sandbox.local.path if self.cfg.sandbox.backend == "local" else DEFAULT_PATH
        return {"PATH": f"{prefix}:{base}"}

    async def capture(self, sandbox: Sandbox, spec: RolloutSpec, workspace: Any) -> str:
        excludes = self._excludes.pop(spec.rollout_id, [])
        captured = await capture_diff(
            sandbox, workspace, exclude=excludes, max_bytes=self.runtime.config.max_diff_bytes
        )
        if captured.too_large:
            raise PatchApplyError(f"the model's diff is {captured.bytes} bytes (over the capture limit)")
        return captured.patch

    async def close_session(self, secret: str) -> Any:
        session_id = self._secrets.pop(secret)
        return await self.gateway.close_session(session_id)

    async def grade(self, spec: RolloutSpec, diff: str) -> Grade:
        sb_spec = grading_spec(spec.task, self._labels(spec, "grading"))
        report = await grade(
            spec.task,
            diff,
            runtime=self.runtime,
            make_sandbox=lambda: self.create_sandbox(spec, "grading", sb_spec),
            policy=self.cfg.grading,
        )
        return Grade(
            reward=report.reward,
            report=report.model_dump(mode="json"),
            verdict=report.status,
            reason=report.reason,
            hack_action=report.hack_action,
            summary=report.summary(),
            test_log=report.test_log,
        )
