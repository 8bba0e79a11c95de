"""Starting engine processes without Ray: scripted workers, the real router, SGLang servers.

Command construction is pure (``*_argv``) so it is testable without the programs;
``start_*`` run them as :class:`~farm.engine.processes.ManagedProcess` and wait until
they answer. The router is ``python -m sglang_router.launch_router`` (sglang-router
0.3.x); SGLang servers are ``python -m sglang.launch_server`` (the ``sglang`` extra).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Sequence

import aiohttp

from farm.engine.routing import MoEShape
from farm.engine.config import FaultConfig, LaunchConfig, LatencyConfig, RouterConfig
from farm.engine.processes import ManagedProcess, free_port, read_ready_file, wait_http_ok, wait_until
from farm.errors import EngineError


def scripted_worker_argv(
    *,
    policy: str,
    tokenizer: str,
    ready_file: str,
    host: str = "127.0.0.1",
    port: int = 0,
    worker_id: str = "scripted-0",
    seed: int = 0,
    tool_format: str = "hermes",
    model_name: str = "farm-policy",
    tasks_path: str | None = None,
    replay_path: str | None = None,
    replies_path: str | None = None,
    record_path: str | None = None,
    stream_interval: int = 1,
    context_length: int = 131072,
    latency: LatencyConfig | None = None,
    faults: FaultConfig | None = None,
    moe: MoEShape | None = None,
    model_path: str | None = None,
    torch_threads: int = 1,
    oracle_reads: int = 0,
    python: str = sys.executable,
) -> list[str]:
    """``python -m farm engine serve ...`` for one worker."""
    lat = latency or LatencyConfig()
    flt = faults or FaultConfig()
    argv = [
        python, "-m", "farm", "engine", "serve",
        "--policy", policy, "--tokenizer", tokenizer, "--host", host, "--port", str(port),
        "--ready-file", ready_file, "--worker-id", worker_id, "--seed", str(seed),
        "--tool-format", tool_format, "--model-name", model_name,
        "--stream-interval", str(stream_interval), "--context-length", str(context_length),
        "--ttft", repr(lat.ttft_s), "--tokens-per-s", repr(lat.tokens_per_s), "--jitter", repr(lat.jitter),
        "--error-rate", repr(flt.error_rate), "--hang-rate", repr(flt.hang_rate),
        "--drop-rate", repr(flt.drop_rate), "--hang-s", repr(flt.hang_s),
    ]
    for flag, value in (("--tasks", tasks_path), ("--replay", replay_path), ("--replies", replies_path),
                        ("--record", record_path)):
        if value:
            argv += [flag, value]
    if moe is not None:
        argv += ["--moe", f"{moe.layers},{moe.top_k},{moe.experts}"]
    if model_path:
        argv += ["--model", model_path, "--torch-threads", str(torch_threads)]
    if oracle_reads:
        argv += ["--oracle-reads", str(oracle_reads)]
    return argv


def router_argv(
    worker_urls: Sequence[str], cfg: RouterConfig, *, port: int, prometheus_port: int,
    python: str = sys.executable,
) -> list[str]:
    """The real router with session affinity (``--policy manual`` keys on the
    ``X-SMG-Routing-Key`` header) and timeouts that suit rollouts."""
    argv = [python, "-m", "sglang_router.launch_router"]
    if worker_urls:
        argv += ["--worker-urls", *worker_urls]
    argv += [
        "--policy", cfg.policy,
        "--host", cfg.host, "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port),
        "--request-timeout-secs", str(cfg.request_timeout_s),
        "--cb-timeout-duration-secs", str(cfg.cb_timeout_s),
        "--health-check-interval-secs", str(cfg.health_check_interval_s),
        "--retry-max-retries", str(cfg.max_retries),
        "--worker-startup-timeout-secs", str(max(1, int(cfg.startup_timeout_s))),
        "--worker-startup-check-interval", "1",
        "--log-level", cfg.log_level,
    ]
    if cfg.policy == "manual":
        argv += ["--assignment-mode", "min_group"]
    return argv + list(cfg.extra_args)


def sglang_server_argv(cfg: LaunchConfig, *, host: str, port: int, model_name: str | None = None,
                       python: str = sys.executable) -> list[str]:
    """``python -m sglang.launch_server`` per SGLang's documented CLI."""
    if not cfg.model_path:
        raise EngineError("engine.launch.model_path is required for mode=launch")
    argv = [python, "-m", "sglang.launch_server", "--model-path", cfg.model_path, "--tp", str(cfg.tp),
            "--host", host, "--port", str(port)]
    if model_name:
        argv += ["--served-model-name", model_name]
    if cfg.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", str(cfg.mem_fraction_static)]
    if cfg.context_length is not None:
        argv += ["--context-length", str(cfg.context_length)]
    return argv + list(cfg.extra_args)


def require_sglang() -> None:
    """Clear error when the GPU-only ``sglang`` package is missing."""
    if importlib.util.find_spec("sglang") is None:
        raise EngineError(
            "engine.mode=launch needs the 'sglang' package (GPU nodes only): pip install 'farm[sglang]'. "
            "Without a GPU use engine.mode=simulator, or point engine.mode=external at a running server."
        )


async def start_scripted_worker(argv_kwargs: dict, *, log_dir: Path, name: str,
                                timeout: float) -> tuple[ManagedProcess, str]:
    """Start ``farm engine serve`` on a free port (it reports the port in a ready file)."""
    ready = log_dir / f"{name}.ready"
    ready.unlink(missing_ok=True)
    proc = ManagedProcess(name, scripted_worker_argv(ready_file=str(ready), worker_id=name, **argv_kwargs),
                          log_path=log_dir / f"{name}.log")
    proc.start()
    try:
        async def ready_ok() -> bool:
            return read_ready_file(ready) is not None

        await wait_until(ready_ok, timeout=timeout, what=f"{name} to listen", proc=proc)
        url = read_ready_file(ready)
        assert url is not None
        await wait_http_ok(url + "/health", timeout=timeout, proc=proc)
    except BaseException:
        await proc.astop()
        raise
    return proc, url


async def start_router(worker_urls: Sequence[str], cfg: RouterConfig, *, log_dir: Path,
                       name: str = "router", attempts: int = 3) -> tuple[ManagedProcess, str]:
    """Start the router and wait until every given worker is registered and healthy.
    Retries on a port race (the router cannot report a port it picked itself)."""
    last: Exception | None = None
    for attempt in range(attempts):
        port = cfg.port or free_port(cfg.host)
        argv = router_argv(worker_urls, cfg, port=port, prometheus_port=free_port("127.0.0.1"))
        proc = ManagedProcess(name, argv, log_path=log_dir / f"{name}.log")
        proc.start()
        url = f"http://{cfg.host}:{port}"
        try:
            await wait_router_workers(url, len(worker_urls), timeout=cfg.startup_timeout_s, proc=proc)
            return proc, url
        except EngineError as exc:
            last = exc
            await proc.astop()
            if cfg.port:
                break
    raise EngineError(f"router did not start after {attempts} attempts: {last}")


async def wait_router_workers(url: str, n: int, *, timeout: float, proc: ManagedProcess | None = None) -> None:
    """Wait until the router answers and lists at least ``n`` healthy workers."""
    async with aiohttp.ClientSession() as session:
        async def check() -> bool:
            try:
                async with session.get(url + "/workers", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status != 200:
                        return False
                    body = await resp.json()
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
                return False
            healthy = [w for w in body.get("workers", []) if w.get("is_healthy")]
            return len(healthy) >= n

        await wait_until(check, timeout=timeout, what=f"router {url} with {n} healthy workers", proc=proc)


async def start_sglang_server(cfg: LaunchConfig, *, host: str, log_dir: Path, name: str,
                              model_name: str | None = None) -> tuple[ManagedProcess, str]:
    require_sglang()
    port = free_port(host if host != "0.0.0.0" else "127.0.0.1")
    proc = ManagedProcess(name, sglang_server_argv(cfg, host=host, port=port, model_name=model_name),
                          log_path=log_dir / f"{name}.log")
    proc.start()
    url = f"http://{host}:{port}"
    try:
        await wait_http_ok(url + "/health", timeout=cfg.startup_timeout_s, proc=proc)
    except BaseException:
        await proc.astop()
        raise
    return proc, url
