"""``Gateway``: the public face of the model gateway (what a sandbox actor uses).

::

    async with EngineClient(router_url, cfg.gateway.engine_client) as engine:
        async with Gateway.from_config(cfg, engine) as gw:     # or Gateway(cfg.gateway, tokenizer, engine, "hermes")
            base_url = gw.base_url                       # started by __aenter__
            handle = gw.open_session(rollout_id, max_turns=50)
            ...  # the CLI uses base_url + handle.secret as its API key
            tree = await gw.close_session(rollout_id)    # aborts in-flight turns
            stats = gw.stats(rollout_id)

The gateway does not own the engine client (close it yourself).

Black-box mode (a hosted endpoint, :mod:`farm.gateway.blackbox`): no tokenizer, no
engine; ``Gateway.for_endpoint(cfg.gateway, name, endpoint, api_key)``, the same
protocols, and ``close_session`` returns the session's Transcript. The gateway's
``mode`` is its service's; each session it opens is of that service's kind
(:mod:`farm.gateway.sessions`: ``TokenSession`` or ``HostedSession``), so nothing here
asks which.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable

from aiohttp import web

from farm.engine.client import EngineClient
from farm.errors import GatewayError
from farm.gateway.app import GatewayApp
from farm.gateway.blackbox import BlackBoxService
from farm.gateway.config import GatewayConfig
from farm.gateway.endpoints import HostedEndpoint, RolloutMode
from farm.gateway.hosted import HostedClient
from farm.gateway.public_url import public_url
from farm.gateway.render import PromptRenderer
from farm.gateway.service import TurnService
from farm.gateway.sessions import SessionHandle, SessionStats, SessionTable
from farm.modeltext.tokenizer import load_tokenizer
from farm.modeltext.toolcalls import ToolCallFormat, get_format
from farm.trajectory.transcript import Transcript
from farm.trajectory.tree import TurnTree

if TYPE_CHECKING:
    from farm.config import FarmConfig

_KEEP_CLOSED_STATS = 4096


class Gateway:
    """One aiohttp server serving every session of one actor."""

    def __init__(self, config: GatewayConfig, tokenizer: Any, engine: EngineClient | None,
                 tool_format: ToolCallFormat | str = "hermes", *, model_name: str = "farm-policy",
                 renderer: PromptRenderer | None = None, black_box: BlackBoxService | None = None) -> None:
        self.config = config
        self.model_name = model_name
        self.service: TurnService | BlackBoxService
        if black_box is not None:  # a hosted endpoint: no tokenizer, no engine (farm.gateway.blackbox)
            self.renderer = None
            self.service = black_box
        else:
            assert engine is not None
            self.renderer = renderer or PromptRenderer(
                tokenizer, template_kwargs=config.chat_template_kwargs, incremental=config.incremental_render,
                special_tokens_in_content=config.special_tokens_in_content)  # fmt: skip
            fmt = get_format(tool_format) if isinstance(tool_format, str) else tool_format
            self.service = TurnService(config, self.renderer, engine, fmt)
        self.sessions = SessionTable(self.service.new_session)  # each session of the service's kind
        self._app = GatewayApp(config, self.sessions, self.service, model_name)
        self._runner: web.AppRunner | None = None
        self._base_url: str | None = None
        self._closed_stats: OrderedDict[str, SessionStats] = OrderedDict()
        self._socket_sites: dict[str, tuple[web.UnixSite, str]] = {}  # session id -> its own listener, path

    @classmethod
    def from_config(cls, cfg: FarmConfig, engine: EngineClient, *, tokenizer: Any = None) -> Gateway:
        """A gateway for a run: ``cfg.gateway``, the tokenizer ``cfg.engine.tokenizer``
        (built/loaded unless given), the tool format ``cfg.engine.tool_parser``."""
        if tokenizer is None:
            tokenizer = load_tokenizer(cfg.engine.tokenizer, cfg.engine.tokenizer_cache_dir)
        return cls(cfg.gateway, tokenizer, engine, cfg.engine.tool_parser, model_name=cfg.engine.model_name)

    @classmethod
    def for_endpoint(cls, config: GatewayConfig, name: str, endpoint: HostedEndpoint, api_key: str | None, *,
                     model_name: str = "farm-policy", tokenizer: Any = None) -> Gateway:
        """A black-box gateway: every session's turns go to the hosted ``endpoint`` (its key
        ``api_key``, read by the entry point) and are recorded as transcripts (``tokenizer``:
        the endpoint model's, for re-tokenized logprob turns)."""
        return cls(config, None, None, model_name=model_name,
                   black_box=BlackBoxService(config, HostedClient(name, endpoint, api_key), tokenizer))

    @property
    def mode(self) -> RolloutMode:
        """Token-exact (the engine) or black-box (a hosted endpoint): its service's."""
        return self.service.mode

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        if self._base_url is None:
            raise GatewayError("gateway not started")
        return self._base_url

    async def start(self) -> str:
        """Bind and serve; returns the base URL the CLIs use (``public_url`` if set)."""
        if self._runner is not None:
            return self.base_url
        runner = web.AppRunner(self._app.build(), handler_cancellation=True, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.config.host, self.config.port, backlog=2048)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self._base_url = (public_url(self.config.public_url, port) or f"http://{host}:{port}").rstrip("/")
        return self._base_url

    async def stop(self) -> None:
        """Close every open session (aborting its turns), then the server. Idempotent."""
        for sid in self.sessions.open_ids():
            await self.close_session(sid)
        for sid in list(self._socket_sites):
            await self._stop_socket(sid)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self.service.aclose()

    # ---- sessions ----------------------------------------------------------------------
    def open_session(self, session_id: str, *, model_name: str | None = None, max_turns: int | None = None,
                     max_context_tokens: int | None = None, policy_version: int | None = None,
                     observer: Callable[[str, dict[str, Any]], None] | None = None) -> SessionHandle:
        """A new session; its ``secret`` is the API key to give the CLI. ``observer(kind,
        data)`` hears ``turn_started`` / ``turn_finished`` as they happen."""
        self._closed_stats.pop(session_id, None)
        session = self.sessions.open(
            session_id, model_name=model_name or self.model_name,
            max_turns=max_turns if max_turns is not None else self.config.max_turns,
            max_context_tokens=max_context_tokens if max_context_tokens is not None else self.config.max_context_tokens,
            policy_version=policy_version, observer=observer,
        )  # fmt: skip
        return SessionHandle(session_id=session.session_id, secret=session.secret)

    async def serve_session_socket(self, session_id: str, path: str) -> None:
        """Also listen on the unix socket ``path`` for ``session_id`` alone (a sandbox's
        forwarded gateway port): through it, any other session's key gets 401. Stopped
        and unlinked when the session closes."""
        if self._runner is None:
            raise GatewayError("gateway not started")
        self.sessions.get(session_id)  # unknown session: GatewayError
        if session_id in self._socket_sites:
            return
        site = web.UnixSite(self._runner, path)
        await site.start()
        self._socket_sites[session_id] = (site, path)
        self._app.socket_sessions[path] = session_id

    async def _stop_socket(self, session_id: str) -> None:
        entry = self._socket_sites.pop(session_id, None)
        if entry is None:
            return
        site, path = entry
        self._app.socket_sessions.pop(path, None)
        await site.stop()
        try:
            os.unlink(path)
        except OSError:
            pass

    async def close_session(self, session_id: str) -> TurnTree | Transcript:
        """Refuse further requests (401), abort in-flight generation, return the session's
        record: its turn tree (black-box mode: its transcript)."""
        await self._stop_socket(session_id)
        session = await self.sessions.close(session_id, timeout_s=self.config.close_timeout_s)
        self.sessions.forget(session_id)
        await self.service.session_closed(session)  # token-exact: the fidelity measure
        self._keep_stats(session_id, session.stats)
        return session.record

    def _keep_stats(self, session_id: str, stats: SessionStats) -> None:
        self._closed_stats[session_id] = stats
        while len(self._closed_stats) > _KEEP_CLOSED_STATS:
            self._closed_stats.popitem(last=False)

    def set_deadline(self, session_id: str, deadline: float) -> None:
        """When (``time.monotonic()``) the open session's agent phase ends: black-box retries
        of a hosted endpoint never wait past it."""
        self.sessions.get(session_id).deadline = deadline

    def session_failure(self, session_id: str) -> tuple[str, str] | None:
        """(Failure, reason) once the endpoint failed the open session for good: a hosted
        one can (black-box mode); the engine never does (None)."""
        return self.sessions.get(session_id).failure

    def session_idle_s(self, session_id: str) -> float:
        """Seconds since the open session last had a model request in flight (0 while one is)."""
        return self.sessions.get(session_id).idle_s()

    def stats(self, session_id: str) -> SessionStats:
        """Counters of an open or recently closed session."""
        if session_id in self._closed_stats:
            return self._closed_stats[session_id]
        return self.sessions.get(session_id).stats

    def tree(self, session_id: str) -> TurnTree | Transcript:
        """The live record of an open session (read-only use): its turn tree, or in
        black-box mode its transcript."""
        return self.sessions.get(session_id).record
