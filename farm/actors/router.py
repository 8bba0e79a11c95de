"""RouterActor: the one ``/generate`` endpoint every gateway calls.

A plain class (made a Ray actor only where the farm is assembled:
``ray.remote(**opts)(RouterActor)``, see :func:`remote_router_actor`) that provides
the engine according to ``engine.mode``:

- ``external``: a URL the user runs (SGLang server or router), health-checked;
- ``router``: the real ``sglang-router`` over ``engine.worker_urls``;
- ``launch``: SGLang servers as Ray actors with ``tp`` GPUs each, the router in front;
- ``simulator``: ``engine.simulator.workers`` simulated workers (``farm.simulator``,
  subprocesses) behind the real router (the local default).

The router uses ``--policy manual``: requests carrying the same ``X-SMG-Routing-Key``
(the gateway sends the session id) stick to one worker, so each rollout's growing
prefix stays in that worker's cache. Everything started here runs in its own process
group with a parent-death signal (:mod:`farm.engine.processes`): :meth:`shutdown`
kills it all, and if the actor itself is killed the kernel does.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any, Sequence

import aiohttp

from farm.engine import admin
from farm.engine.admin import EngineHealth, WeightUpdate, WorkerInfo
from farm.engine.config import EngineConfig, LaunchConfig
from farm.engine.launchers import require_sglang, start_router, start_scripted_worker, start_sglang_server
from farm.engine.processes import ManagedProcess
from farm.simulator.tasks import write_tasks_jsonl
from farm.modeltext.tokenizer import resolve_tokenizer
from farm.errors import EngineError
from farm.tasks.model import Task


def _node_ip() -> str:
    try:
        # ray only to name this node, when it is there and started
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except ImportError:
        pass
    return socket.gethostbyname(socket.gethostname())


class SGLangServerActor:
    """One ``python -m sglang.launch_server`` (mode=launch); a Ray actor with ``tp`` GPUs."""

    def __init__(self, cfg: LaunchConfig, *, model_name: str | None = None, name: str = "sglang-0") -> None:
        self.cfg, self.model_name, self.name = cfg, model_name, name
        self._proc: ManagedProcess | None = None
        self._dir: str | None = None

    async def start(self) -> str:
        require_sglang()
        self._dir = tempfile.mkdtemp(prefix="farm-sglang-")
        self._proc, url = await start_sglang_server(self.cfg, host="0.0.0.0", log_dir=Path(self._dir),
                                                    name=self.name, model_name=self.model_name)
        return url.replace("0.0.0.0", _node_ip())

    async def stop(self) -> None:
        if self._proc is not None:
            await self._proc.astop()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


class RouterActor:
    def __init__(self, cfg: EngineConfig, *, tasks: Sequence[Task] | None = None, tasks_path: str | None = None,
                 work_dir: str | None = None) -> None:
        self.cfg = cfg
        self._tasks = list(tasks) if tasks is not None else None
        self._tasks_path = tasks_path or cfg.simulator.tasks_path
        self._given_dir = work_dir
        self._dir: Path | None = None
        self._url: str | None = None
        self._router: ManagedProcess | None = None
        self._workers: dict[str, ManagedProcess] = {}  # scripted workers we own, by url
        self._servers: list[Any] = []  # SGLangServerActor handles (launch)
        self._worker_args: dict[str, Any] = {}
        self._n_started = 0
        self._policy_version = 0
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._start_ended = asyncio.Event()  # a start() ended, up or failed (url_when_started)

    # -- lifecycle -------------------------------------------------------------------
    async def start(self) -> str:
        """Bring the engine up (idempotent); returns the base URL."""
        async with self._lock:
            if self._url is not None:
                return self._url
            self._session = aiohttp.ClientSession()
            self._dir = Path(self._given_dir or tempfile.mkdtemp(prefix="farm-engine-"))
            self._dir.mkdir(parents=True, exist_ok=True)
            try:
                await self._start_mode()
            except BaseException:
                await self._teardown()
                raise
            finally:
                self._start_ended.set()
            assert self._url is not None
            return self._url

    async def url_when_started(self) -> str:
        """The base URL once the driver's ``start()`` has brought the engine up (waits for a
        start in flight; raises EngineError if it failed). Never starts the engine itself:
        sandbox actors started beside the engine ask this (``FarmActors.start_engine``)."""
        await self._start_ended.wait()
        return self.base_url()

    async def _start_mode(self) -> None:
        cfg, mode = self.cfg, self.cfg.mode
        if mode == "external":
            if not cfg.url:
                raise EngineError("engine.mode=external needs engine.url")
            self._url = cfg.url.rstrip("/")
            if not await admin.is_healthy(self._http, self._url, timeout=cfg.health_timeout_s):
                raise EngineError(f"engine at {self._url} is not healthy (GET /health)")
            return
        if mode == "router":
            if not cfg.worker_urls:
                raise EngineError("engine.mode=router needs engine.worker_urls")
            urls = list(cfg.worker_urls)
        elif mode == "simulator":
            await self._prepare_scripted()
            started = await asyncio.gather(
                *(self._spawn_worker() for _ in range(cfg.simulator.workers)), return_exceptions=True)
            errors = [e for e in started if isinstance(e, BaseException)]
            if errors:
                raise errors[0]
            urls = list(self._workers)
        else:
            urls = await self._launch_servers()
        self._router, url = await start_router(urls, cfg.router, log_dir=self._dir_path)
        self._url = url.replace("0.0.0.0", _node_ip())

    async def _prepare_scripted(self) -> None:
        s = self.cfg.simulator
        tokenizer = await asyncio.to_thread(resolve_tokenizer, self.cfg.tokenizer, self.cfg.tokenizer_cache_dir)
        tasks_path = self._tasks_path
        if self._tasks is not None:
            tasks_path = str(write_tasks_jsonl(self._tasks, self._dir_path / "tasks.jsonl"))
        if self.cfg.policy in ("oracle", "shell", "choose") and not tasks_path:
            raise EngineError(f"policy {self.cfg.policy!r} needs tasks (engine.simulator.tasks_path or RouterActor(tasks=...))")
        self._worker_args = dict(
            policy=self.cfg.policy, tokenizer=tokenizer, seed=s.seed, tool_format=self.cfg.tool_parser,
            model_name=self.cfg.model_name, tasks_path=tasks_path, replay_path=s.replay_path,
            replies_path=s.replies_path, stream_interval=s.stream_interval, context_length=s.context_length,
            latency=s.latency, faults=s.faults, moe=self.cfg.moe, model_path=s.model_path,
            torch_threads=s.torch_threads,
        )

    async def _spawn_worker(self) -> str:
        i = self._n_started
        self._n_started += 1
        kwargs = dict(self._worker_args)
        if self.cfg.simulator.record_path:
            kwargs["record_path"] = f"{self.cfg.simulator.record_path}.{i}"
        proc, url = await start_scripted_worker(kwargs, log_dir=self._dir_path, name=f"scripted-{i}",
                                                timeout=self.cfg.simulator.startup_timeout_s)
        self._workers[url] = proc
        return url

    async def _launch_servers(self) -> list[str]:
        # heavy: ray
        import ray

        launch = self.cfg.launch
        remote_cls = ray.remote(num_gpus=launch.tp, max_restarts=0)(SGLangServerActor)
        self._servers = [remote_cls.remote(launch, model_name=self.cfg.model_name, name=f"sglang-{i}")
                         for i in range(launch.workers)]
        return list(await asyncio.gather(*(s.start.remote() for s in self._servers)))

    async def shutdown(self) -> None:
        """Stop the router, then every worker / server started here. Idempotent."""
        async with self._lock:
            await self._teardown()

    async def _teardown(self) -> None:
        if self._router is not None:
            await self._router.astop()
            self._router = None
        await asyncio.gather(*(p.astop() for p in self._workers.values()))
        self._workers.clear()
        if self._servers:
            # heavy: ray
            import ray

            await asyncio.gather(*(s.stop.remote() for s in self._servers), return_exceptions=True)
            for s in self._servers:
                ray.kill(s)
            self._servers = []
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._dir is not None and self._given_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self._url = None

    # -- queries ---------------------------------------------------------------------
    def base_url(self) -> str:
        if self._url is None:
            raise EngineError("engine not started")
        return self._url

    def policy_version(self) -> int:
        return self._policy_version

    def log_dir(self) -> str | None:
        """Where the engine processes' logs (and ready files) live while it runs."""
        return str(self._dir) if self._dir is not None else None

    def processes(self) -> dict[str, int]:
        """Name -> pid of every process started here (router, scripted workers)."""
        out = {p.name: p.pid for p in self._workers.values() if p.pid is not None}
        if self._router is not None and self._router.pid is not None:
            out[self._router.name] = self._router.pid
        return out

    async def workers(self) -> list[WorkerInfo]:
        url = self.base_url()
        if self.cfg.mode == "external":
            try:
                return await admin.router_workers(self._http, url, timeout=self.cfg.health_timeout_s)
            except EngineError:  # a plain SGLang server, not a router
                return [WorkerInfo(url=url, healthy=await admin.is_healthy(self._http, url,
                                                                           timeout=self.cfg.health_timeout_s))]
        return await admin.router_workers(self._http, url, timeout=self.cfg.health_timeout_s)

    async def health(self) -> EngineHealth:
        mode, url = self.cfg.mode, self._url
        if url is None:
            return EngineHealth(healthy=False, reason="not started", mode=mode, url=None)
        if self._router is not None and not self._router.alive():
            return EngineHealth(healthy=False, reason=f"router exited ({self._router.returncode})", mode=mode,
                                url=url, policy_version=self._policy_version)
        try:
            up = await admin.is_healthy(self._http, url, timeout=self.cfg.health_timeout_s)
            workers = await self.workers()
        except EngineError as exc:
            return EngineHealth(healthy=False, reason=str(exc), mode=mode, url=url,
                                policy_version=self._policy_version)
        n_ok = sum(w.healthy for w in workers)
        reason = "" if up and n_ok else ("no healthy worker" if up else f"GET {url}/health failed")
        return EngineHealth(healthy=bool(up and n_ok), reason=reason, mode=mode, url=url, workers=workers,
                            policy_version=self._policy_version)

    # -- workers -----------------------------------------------------------------------
    async def add_worker(self, url: str) -> WorkerInfo:
        """Register a running SGLang-protocol worker with the router."""
        self._need_router("add_worker")
        return await admin.router_add_worker(self._http, self.base_url(), url.rstrip("/"),
                                             timeout=self.cfg.router.startup_timeout_s)

    async def add_scripted_worker(self) -> WorkerInfo:
        """Start one more scripted worker and register it (mode=simulator)."""
        if self.cfg.mode != "simulator":
            raise EngineError("add_scripted_worker needs engine.mode=simulator")
        url = await self._spawn_worker()
        return await self.add_worker(url)

    async def remove_worker(self, url: str) -> None:
        """Deregister a worker; stop it too if it was started here."""
        self._need_router("remove_worker")
        url = url.rstrip("/")
        await admin.router_remove_worker(self._http, self.base_url(), url, timeout=self.cfg.router.startup_timeout_s)
        proc = self._workers.pop(url, None)
        if proc is not None:
            await proc.astop()

    def kill_worker(self, url: str) -> None:
        """SIGKILL a scripted worker started here (fault drills); the router notices by itself."""
        proc = self._workers.get(url.rstrip("/"))
        if proc is None:
            raise EngineError(f"{url} is not a worker started here")
        proc.kill()

    async def update_weights_from_disk(self, model_path: str) -> WeightUpdate:
        """Load new weights on every worker (see ``update_weights``)."""
        return await self.update_weights(model_path)

    async def update_weights(self, model_path: str | None = None, version: int | None = None) -> WeightUpdate:
        """A new policy on every worker behind the router, as one step: generation is
        paused on all of them (``engine.weight_update_pause``), each loads ``model_path``
        (SGLang's ``/update_weights_from_disk``) or, without a path, only stamps the new
        version (``/update_weight_version``: the trainer synced the weights itself), and
        generation resumes, also when the update failed. The version (``version``, else
        the current one + 1) goes out as SGLang's ``weight_version``, which every later
        ``/generate`` reply carries in ``meta_info.weight_version``. All workers must succeed."""
        async with self._lock:
            target = self._policy_version + 1 if version is None else int(version)
            if target < self._policy_version:
                raise EngineError(f"weight version {target} is older than the current {self._policy_version}")
            urls = [w.url for w in await self.workers()]
            timeout = self.cfg.launch.startup_timeout_s
            pause = self.cfg.weight_update_pause
            if pause != "none":
                await self._all(urls, lambda u: admin.pause_generation(self._http, u, pause,
                                                                       timeout=self.cfg.health_timeout_s))
            try:
                if model_path is not None:
                    results = await self._all(urls, lambda u: admin.update_weights_from_disk(
                        self._http, u, model_path, str(target), timeout=timeout))
                else:
                    results = await self._all(urls, lambda u: admin.update_weight_version(
                        self._http, u, str(target), timeout=timeout))
            finally:
                if pause != "none":
                    await self._all(urls, lambda u: admin.continue_generation(self._http, u,
                                                                              timeout=self.cfg.health_timeout_s))
            self._policy_version = target
            return WeightUpdate(policy_version=target, model_path=model_path or "",
                                messages={u: str(r) for u, r in zip(urls, results)})

    async def _all(self, urls: list[str], call: Any) -> list[Any]:
        """``call(url)`` on every worker at once; raises naming each worker that failed."""
        results = await asyncio.gather(*(call(u) for u in urls), return_exceptions=True)
        failed = {u: str(r) for u, r in zip(urls, results) if isinstance(r, BaseException)}
        if failed:
            raise EngineError(f"{len(failed)}/{len(urls)} workers failed: {failed}")
        return list(results)

    # -- helpers -------------------------------------------------------------------------
    @property
    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise EngineError("engine not started")
        return self._session

    @property
    def _dir_path(self) -> Path:
        assert self._dir is not None
        return self._dir

    def _need_router(self, what: str) -> None:
        if self.cfg.mode == "external":
            raise EngineError(f"{what} needs a router farm started (mode router/simulator/launch)")


def remote_router_actor(cfg: EngineConfig, *, name: str | None = None, **kwargs: Any) -> Any:
    """Create the Ray actor (for assembly code and tests): ``await handle.start.remote()``."""
    # heavy: ray
    import ray

    opts: dict[str, Any] = {"num_cpus": 0, "max_restarts": 0}
    if name:
        opts["name"] = name
    return ray.remote(**opts)(RouterActor).remote(cfg, **kwargs)
