"""``farm serve [--config CONFIG] [--set k=v] [--host 127.0.0.1] [--port 8765]``: the
single-rollout service over HTTP (``farm.single.http``: REST + SSE, bearer token).

The token is read from the environment variable named by ``--token-env`` (default
``FARM_SERVE_TOKEN``); unset, a random one is made and printed. 127.0.0.1 by default:
another host is an explicit ``--host``. Prints ``farm serve: listening on URL`` once
ready. SIGINT / SIGTERM: running rollouts are aborted (nothing stored), finished ones
finalized, then it exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import sys
from collections.abc import Iterator


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML config (default: farm's defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--placement", choices=("auto", "local", "ray"), default="auto",
                        help="where rollouts run: this process, or the farm's sandbox actors on Ray "
                        "(auto: Ray when RAY_ADDRESS or ray.address is set)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="0: any free port")
    parser.add_argument("--token-env", default="FARM_SERVE_TOKEN", help="env var holding the bearer token")
    parser.add_argument("--openenv", action="store_true",
                        help="serve the OpenEnv MCP environment (needs the openenv extra) instead of the REST API")


def _quiet_server_class() -> type:
    # heavy: uvicorn
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn re-raises a captured SIGTERM once it has stopped, which would kill this
        process before the service closes (running rollouts aborted, finished ones
        stored): signals are ours (loop handlers setting ``should_exit``)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer


async def _serve_openenv(args: argparse.Namespace, token: str) -> None:
    """OpenEnv's FastAPI app under uvicorn, in this loop (the service's loop)."""
    # heavy: uvicorn
    import uvicorn

    # the CLI's start-up: a command loads its code when it runs; heavy: aiohttp, numpy, orjson
    from farm.errors import ConfigError
    from farm.single import Rollouts

    try:
        # optional extra: openenv
        from farm.single.mcp_env import make_openenv_app
    except ModuleNotFoundError as exc:
        raise ConfigError(f"--openenv needs the openenv extra (pip install 'farm[openenv]'): {exc}") from None

    async with Rollouts(args.config, overrides=args.overrides, placement=args.placement) as farm_:
        print(f"farm serve: run {farm_.cfg.run_id}, rollouts written to {farm_.out_dir}", file=sys.stderr, flush=True)
        config = uvicorn.Config(make_openenv_app(farm_, token), host=args.host, port=args.port, log_level="warning",
                                lifespan="on")  # fmt: skip
        server = _quiet_server_class()(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, setattr, server, "should_exit", True)
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if serving.done():
            serving.result()  # the bind failed: raise it
            return
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        print(f"farm serve: listening on http://{host}:{port}/{token} (OpenEnv MCP environment)", flush=True)
        await serving
        print("farm serve: stopping (aborting running rollouts, finalizing finished ones)", file=sys.stderr)


async def _serve(args: argparse.Namespace, token: str) -> None:
    # heavy: aiohttp
    from aiohttp import web

    # heavy: aiohttp, numpy, orjson
    from farm.single import Rollouts
    from farm.single.http import make_app

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Rollouts(args.config, overrides=args.overrides, placement=args.placement) as farm_:
        print(f"farm serve: run {farm_.cfg.run_id}, rollouts written to {farm_.out_dir}", file=sys.stderr, flush=True)
        runner = web.AppRunner(make_app(farm_, token), access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        try:
            site = web.TCPSite(runner, args.host, args.port)
            await site.start()
            host, port = runner.addresses[0][:2]
            print(f"farm serve: listening on http://{host}:{port}", flush=True)
            await stop.wait()
            print("farm serve: stopping (aborting running rollouts, finalizing finished ones)", file=sys.stderr)
        finally:
            await runner.cleanup()


def run(args: argparse.Namespace) -> int:
    # the CLI's start-up: a command loads its code when it runs
    from farm.errors import FarmError

    token = os.environ.get(args.token_env, "")
    if not token:
        token = secrets.token_urlsafe(24)  # url-safe: it is also the OpenEnv server's path
        print(f"farm serve: ${args.token_env} is not set; bearer token for this server: {token}", file=sys.stderr)
    try:
        asyncio.run(_serve_openenv(args, token) if args.openenv else _serve(args, token))
    except FarmError as exc:
        print(f"farm serve: {exc}", file=sys.stderr)
        return 2 if type(exc).__name__ == "ConfigError" else 1
    return 0
