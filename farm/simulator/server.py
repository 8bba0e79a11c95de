"""The scripted worker: an aiohttp server speaking SGLang's native HTTP protocol.

Routes (as SGLang 0.5.x serves them): ``POST /generate`` (non-streamed, or SSE
``data: {...}`` cumulative chunks then ``data: [DONE]``), ``GET /health``,
``/health_generate``, ``/model_info`` + ``/get_model_info``, ``/server_info`` +
``/get_server_info``, ``/v1/models``, ``POST /abort_request``, ``/flush_cache``,
``POST /update_weights_from_disk``, ``GET /get_weight_version``. Farm's own debug
routes: ``GET /farm/stats`` (per-worker counters, e.g. requests per routing key) and
``POST /farm/script`` (feed the ``scripted`` policy).

What the model says comes from a :class:`~farm.simulator.policy.Policy`; how
it is decoded follows SGLang's stop rules (:mod:`.generation`); latency and injected
faults come from :mod:`.faults`. With a model (:mod:`.scoring`: ``farm engine serve
--model``) the model samples the policy's choices and scores every emitted token, and
``/update_weights_from_disk`` loads new weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from farm.engine.config import FaultConfig, LatencyConfig
from farm.engine.routing import MoEShape
from farm.simulator.faults import Fault, RequestPlan, plan_request
from farm.simulator.generation import Completion, apply_stop_rules, fake_logprobs, prompt_digest
from farm.simulator.policy import Policy, PolicyReply, PolicyRequest
from farm.simulator.protocol import GenerateRequest, RequestError, SamplingParams, error_body, parse_generate
from farm.simulator.job import Disconnected, Dropped, Job, drop, dumps, gone, json_or_empty, sse, wait
from farm.simulator.replay import Recorder
from farm.simulator.scoring import Scorer, check_ids, planned_ids
from farm.simulator.state import Inflight, PrefixCache, WorkerStats
from farm.simulator.weights import WeightRoutes

ROUTING_KEY_HEADER = "x-smg-routing-key"
VERSION = "0.5.0-farm-scripted"


class WorkerSettings(BaseModel):
    """One scripted worker."""

    model_config = ConfigDict(extra="forbid")

    worker_id: str = "scripted-0"
    model_name: str = Field(default="farm-policy", description="served model name")
    model_path: str = Field(default="", description="reported model path (default: the tokenizer dir, so "
                            "the router can load the tokenizer offline)")
    tokenizer_path: str = ""
    seed: int = 0
    stream_interval: int = Field(default=1, ge=1)
    context_length: int = Field(default=131072, ge=1)
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    faults: FaultConfig = Field(default_factory=FaultConfig)
    record_path: str | None = None
    moe: MoEShape | None = Field(default=None, description="simulate this MoE (routed experts on request)")


class ScriptedWorker(WeightRoutes):
    """State and handlers of one worker; ``app()`` builds the aiohttp application."""

    def __init__(self, tokenizer: Any, policy: Policy, settings: WorkerSettings | None = None,
                 scorer: Scorer | None = None) -> None:
        self.tok = tokenizer
        self.policy = policy
        self.scorer = scorer  # the model (None: made-up logprobs, uniform choices)
        self.settings = settings or WorkerSettings()
        eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self.eos_ids = frozenset(eos)
        self.filler = tokenizer.encode(" the", add_special_tokens=False) or [0]
        self.rng = random.Random(self.settings.seed)
        self.weight_version = "default"
        self.model_path = self.settings.model_path or self.settings.tokenizer_path or "farm-scripted"
        self.inflight: dict[str, Inflight] = {}
        self._running = asyncio.Event()  # cleared while generation is paused (/pause_generation)
        self._running.set()
        self.stats = WorkerStats()
        self.cache = PrefixCache()
        self.recorder = Recorder(self.settings.record_path) if self.settings.record_path else None

    @property
    def moe(self) -> MoEShape | None:
        return self.settings.moe

    # -- tokenizer helpers -----------------------------------------------------
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def complete(self, reply: PolicyReply, input_ids: list[int], sp: SamplingParams, max_new: int,
                 scorer: Scorer | None, seed: int) -> tuple[Completion, list[float]]:
        """The reply decoded under SGLang's stop rules, and one logprob per emitted token:
        the model's (``scorer``) or made up. CPU work: a worker with a model runs it in a thread."""
        ids = planned_ids(reply, input_ids, sp, encode=self.encode, decode=self.decode,
                          eos_id=self.tok.eos_token_id, scorer=scorer, seed=seed)
        completion = apply_stop_rules(ids, sp, eos_ids=self.eos_ids, max_new_tokens=max_new, decode=self.decode,
                                      filler=self.filler)
        if scorer is None:
            n = len(completion.output_ids)
            return completion, fake_logprobs(self.settings.seed, prompt_digest(input_ids), n, sp.temperature)
        return completion, scorer.logprobs(input_ids, completion.output_ids, sp.temperature)

    # -- app -------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        r = app.router
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_post("/abort_request", self.abort_request)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        r.add_get("/get_weight_version", self.get_weight_version)
        r.add_post("/update_weight_version", self.update_weight_version)
        r.add_post("/pause_generation", self.pause_generation)
        r.add_post("/continue_generation", self.continue_generation)
        r.add_get("/farm/stats", self.farm_stats)
        r.add_post("/farm/script", self.farm_script)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, _app: web.Application) -> None:
        for state in self.inflight.values():
            state.message = "server shutdown"
            state.abort.set()
        if self.recorder is not None:
            self.recorder.close()

    # -- simple routes -----------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    def _model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.settings.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "scripted" if self.scorer is None else "farm_tiny_lm",
            "architectures": ["ScriptedForCausalLM" if self.scorer is None else "TinyLM"],
        }

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response(self._model_info())

    async def server_info(self, request: web.Request) -> web.Response:
        s = self.settings
        return web.json_response({
            "model_path": self.model_path,
            "tokenizer_path": s.tokenizer_path,
            "served_model_name": s.model_name,
            "context_length": s.context_length,
            "max_req_input_len": s.context_length - 1,
            "tp_size": 1,
            "dp_size": 1,
            "stream_interval": s.stream_interval,
            "skip_tokenizer_init": False,
            "weight_version": self.weight_version,
            "internal_states": [{"inflight": len(self.inflight)}],
            "version": VERSION,
            "farm": {"worker_id": s.worker_id, "policy": getattr(self.policy, "name", "?"), **self.stats.as_dict()},
        })

    async def models(self, request: web.Request) -> web.Response:
        name = self.settings.model_name
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": self.settings.context_length,
        }]})

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        rid = str(body.get("rid") or "")
        abort_all = bool(body.get("abort_all", False))
        for key, state in list(self.inflight.items()):
            if abort_all or (rid and key.startswith(rid)):
                state.message = "Abort by user (abort_request)"
                state.abort.set()
        return web.Response(status=200)

    async def flush_cache(self, request: web.Request) -> web.Response:
        self.cache.clear()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. "
                                 "(When there are running or waiting requests, the operation will not be performed.)\n")

    async def farm_stats(self, request: web.Request) -> web.Response:
        stats = {"worker_id": self.settings.worker_id, "policy": getattr(self.policy, "name", "?"),
                 "inflight": len(self.inflight), "weight_version": self.weight_version, **self.stats.as_dict()}
        if hasattr(self.policy, "misses"):
            stats["replay_misses"] = self.policy.misses
        return web.json_response(stats)

    async def farm_script(self, request: web.Request) -> web.Response:
        push = getattr(self.policy, "push", None)
        if push is None:
            return web.json_response(error_body("policy is not 'scripted'", 409), status=409)
        body = await json_or_empty(request)
        replies = body.get("replies") or []
        if not isinstance(replies, list):
            return web.json_response(error_body("'replies' must be a list", 400), status=400)
        try:
            push(*replies, routing_key=body.get("routing_key"))
        except ValueError as exc:
            return web.json_response(error_body(str(exc), 400), status=400)
        return web.json_response({"pending": self.policy.pending()})  # type: ignore[attr-defined]

    # -- /generate ---------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            try:
                body = await request.json()
            except ValueError as exc:
                raise RequestError(f"invalid JSON body: {exc}") from exc
            req = parse_generate(body)
            input_ids = req.input_ids if req.input_ids is not None else self.encode(req.text or "")
            ctx = self.settings.context_length
            if len(input_ids) >= ctx:
                raise RequestError(f"The input ({len(input_ids)} tokens) is longer than the model's "
                                   f"context length ({ctx} tokens).")
            if self.scorer is not None:
                check_ids(self.scorer, input_ids)
            if req.return_routed_experts and not 0 <= req.routed_experts_start_len <= len(input_ids):
                raise RequestError(f"routed_experts_start_len {req.routed_experts_start_len} must be in "
                                   f"[0, {len(input_ids)}] (the prompt tokens)")
            rid = req.rid or uuid.uuid4().hex
            if rid in self.inflight:
                raise RequestError(f"Duplicate request id {rid!r}")
        except RequestError as exc:
            self.stats.rejected += 1
            return web.json_response(error_body(str(exc), exc.status), status=exc.status)

        routing_key = request.headers.get(ROUTING_KEY_HEADER)
        self.stats.on_request(routing_key)
        plan = plan_request(self.rng, self.settings.latency, self.settings.faults)
        if plan.fault is not Fault.NONE:
            self.stats.faults[plan.fault.value] += 1
        if plan.fault is Fault.ERROR:
            return web.json_response(error_body("injected fault: internal server error", 500), status=500)
        if plan.fault is Fault.MALFORMED:  # a 200 that is not SGLang's reply (a misconfigured server, a proxy)
            return web.json_response({"text": "injected fault: not a /generate reply", "meta_info": {}})

        state = Inflight(rid)
        self.inflight[rid] = state
        try:
            if not self._running.is_set():  # paused: admitted, waits for /continue_generation
                await self._running.wait()
            if plan.fault is Fault.HANG:
                await wait(state, self.settings.faults.hang_s, request)
                if gone(request):
                    self.stats.disconnected += 1
                    return web.Response(status=499)
            return await self._run(request, req, input_ids, rid, routing_key, plan, state)
        finally:
            self.inflight.pop(rid, None)

    async def _run(self, request: web.Request, req: GenerateRequest, input_ids: list[int], rid: str,
                   routing_key: str | None, plan: RequestPlan, state: Inflight) -> web.StreamResponse:
        t0 = time.monotonic()
        sp = req.sampling_params
        preq = PolicyRequest(rid=rid, input_ids=input_ids, sampling=sp, routing_key=routing_key,
                             decode=self.decode)
        reply = self.policy.respond(preq)
        max_new = sp.max_new_tokens if sp.max_new_tokens is not None else self.settings.context_length
        max_new = min(max_new, self.settings.context_length - len(input_ids))
        # A sampled choice: SGLang's sampling_seed, else the worker's seeded stream.
        seed = sp.sampling_seed if sp.sampling_seed is not None else (
            self.rng.getrandbits(63) if reply.choice is not None else 0)
        # The weights this reply is computed with; pauses so far (a later one may retract it).
        scorer, version, pauses = self.scorer, self.weight_version, self.stats.pauses
        try:
            if scorer is None:
                completion, logprobs = self.complete(reply, input_ids, sp, max_new, None, seed)
            else:
                completion, logprobs = await asyncio.to_thread(self.complete, reply, input_ids, sp, max_new,
                                                               scorer, seed)
        except RequestError as exc:
            return web.json_response(error_body(str(exc), exc.status), status=exc.status)
        cached = self.cache.match(routing_key, input_ids)
        job = Job(self, req, input_ids, rid, completion, logprobs, cached, t0,
                  weight_version=None if scorer is None else version, pauses=pauses)
        if req.stream:
            resp = await self._stream(request, job, plan, state)
        else:
            resp = await self._respond(request, job, plan, state)
        if job.finish is not None and job.finish.get("type") != "abort":
            self.cache.store(routing_key or rid, list(input_ids) + completion.output_ids)
            if self.recorder is not None:
                self.recorder.write(preq, completion.output_ids, job.text(len(completion.output_ids)), job.finish)
        return resp

    async def _emit(self, request: web.Request, job: Job, plan: RequestPlan, state: Inflight,
                    step: int) -> AsyncIterator[int]:
        """Yield how many tokens exist after each decode step; honours latency, aborts,
        disconnects and the DROP fault (raises ``Dropped``)."""
        n = len(job.completion.output_ids)
        drop_at = max(1, int(n * plan.drop_after_fraction)) if plan.fault is Fault.DROP else None
        if plan.ttft_s and await wait(state, plan.ttft_s, request):
            return
        k = 0
        while k < n:
            if not self._running.is_set():  # paused mid-generation (retract / in_place)
                await self._running.wait()
                if state.abort.is_set():
                    return
            prev, k = k, min(n, k + step)
            delay = plan.per_token_s * (k - prev)
            if delay > 0:
                if await wait(state, delay, request):
                    return
            else:
                await asyncio.sleep(0)
                if state.abort.is_set():
                    return
            if gone(request):
                raise Disconnected
            if drop_at is not None and k >= drop_at:
                raise Dropped
            yield k

    async def _respond(self, request: web.Request, job: Job, plan: RequestPlan,
                       state: Inflight) -> web.StreamResponse:
        step = max(16, self.settings.stream_interval)
        emitted = 0
        try:
            if plan.per_token_s == 0 and plan.ttft_s == 0 and plan.fault is Fault.NONE:
                await asyncio.sleep(0)
                emitted = len(job.completion.output_ids)
            else:
                async for emitted in self._emit(request, job, plan, state, step):
                    pass
            await self._rescore(job)
        except Dropped:  # headers and part of the body go out, then the connection is cut
            body = dumps(job.out(emitted, state, final=False)).encode()
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = len(body)
            with contextlib.suppress(ConnectionResetError):
                await resp.prepare(request)
                await resp.write(body[: len(body) // 2])
            drop(request)
            return resp
        except Disconnected:
            self.stats.disconnected += 1
            return web.Response(status=499)
        return web.json_response(job.out(emitted, state, final=True), dumps=dumps)

    async def _stream(self, request: web.Request, job: Job, plan: RequestPlan,
                      state: Inflight) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        step = job.req.sampling_params.stream_interval or self.settings.stream_interval
        n = len(job.completion.output_ids)
        emitted = 0
        try:
            await resp.prepare(request)
            async for emitted in self._emit(request, job, plan, state, step):
                if emitted < n:
                    await resp.write(sse(job.out(emitted, state, final=False)))
            await self._rescore(job)
            await resp.write(sse(job.out(emitted, state, final=True)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except Dropped:
            drop(request)
        except (Disconnected, ConnectionResetError):
            self.stats.disconnected += 1
            job.finish = None
        return resp


@contextlib.asynccontextmanager
async def serve_worker(worker: ScriptedWorker, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Run ``worker`` in this event loop; yields its base URL; stops on exit."""
    runner = web.AppRunner(worker.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()
