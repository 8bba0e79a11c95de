"""One admitted ``/generate`` request: its planned completion, how its (partial) state
serializes into SGLang's response dict, and the waits that honour aborts/disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Protocol, Sequence

import numpy as np
from aiohttp import web

from farm.engine.routing import encode_routed, fake_routing
from farm.simulator.generation import Completion, IncrementalText, final_text
from farm.simulator.protocol import GenerateRequest, finish_abort
from farm.simulator.state import Inflight


class WorkerView(Protocol):
    """What a job uses of its worker (``server.ScriptedWorker``, which imports this module)."""

    stats: Any
    weight_version: str

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...


class Dropped(Exception):
    """The DROP fault fired: cut the connection."""


class Disconnected(Exception):
    """The client went away (SGLang aborts the request)."""


class Job:
    """One admitted request's outcome and how to serialize its (partial) state."""

    def __init__(self, worker: WorkerView, req: GenerateRequest, input_ids: list[int], rid: str,
                 completion: Completion, logprobs: list[float], cached: int, t0: float, *,
                 weight_version: str | None = None, pauses: int = 0) -> None:
        self.worker, self.req, self.input_ids, self.rid = worker, req, input_ids, rid
        self.completion, self.logprobs, self.cached, self.t0 = completion, logprobs, cached, t0
        # The version the logprobs were computed with (a model's); None: made-up logprobs,
        # stamped with whatever version the worker serves when the reply goes out.
        self.weight_version = weight_version
        self.pauses = pauses  # the worker's pause count when it was computed
        sp = req.sampling_params
        self._inc = IncrementalText(lambda ids: worker.decode(ids, sp.skip_special_tokens))
        self.finish: dict[str, Any] | None = None

    @property
    def version(self) -> str:
        return self.weight_version if self.weight_version is not None else self.worker.weight_version

    def text(self, k: int) -> str:
        return final_text(self.worker.decode, self.completion.output_ids[:k], self.finish,
                          self.req.sampling_params)

    def out(self, k: int, state: Inflight, *, final: bool) -> dict[str, Any]:
        ids = self.completion.output_ids[:k]
        if final:
            complete = k == len(self.completion.output_ids)
            self.finish = self.completion.finish_reason if complete else finish_abort(state.message or "Abort")
            stats = self.worker.stats
            stats.finished[self.finish["type"]] += 1
            stats.versions_served[self.version] += 1
            stats.prompt_tokens += len(self.input_ids)
            stats.completion_tokens += k
            stats.cached_tokens += self.cached
            text = self.text(k)
        else:
            text = self._inc.update(ids)
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish if final else None,
            "prompt_tokens": len(self.input_ids),
            "weight_version": self.version,
        }
        if self.req.return_logprob:
            with_text = self.req.return_text_in_logprobs
            meta["input_token_logprobs"] = [[None, self.input_ids[-1],
                                             self.worker.decode([self.input_ids[-1]]) if with_text else None]]
            meta["output_token_logprobs"] = [
                [lp, tok, self.worker.decode([tok]) if with_text else None]
                for lp, tok in zip(self.logprobs[:k], ids)
            ]
        meta["completion_tokens"] = k
        meta["cached_tokens"] = self.cached
        if final:
            meta["e2e_latency"] = time.monotonic() - self.t0
            moe = getattr(self.worker, "moe", None)
            if self.req.return_routed_experts and moe is not None:
                # SGLang: rows for positions [start_len, seqlen - 1), base64 int32
                seq = np.concatenate([np.asarray(self.input_ids, dtype=np.int64), np.asarray(ids, dtype=np.int64)])
                rows = fake_routing(seq, self.req.routed_experts_start_len, len(seq) - 1, moe)
                meta["routed_experts"] = encode_routed(rows)
        return {"text": text, "output_ids": ids, "meta_info": meta}


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


def gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()


async def wait(state: Inflight, seconds: float, request: web.Request) -> bool:
    """Sleep up to ``seconds``; True if the request was aborted meanwhile. Stops early
    when the client disconnects (checked every 50 ms)."""
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or gone(request):
            return state.abort.is_set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(state.abort.wait(), timeout=min(left, 0.05))
        if state.abort.is_set():
            return True


async def json_or_empty(request: web.Request) -> dict[str, Any]:
    """A request's JSON object body, or ``{}`` (SGLang's control routes accept an empty body)."""
    try:
        body = await request.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
