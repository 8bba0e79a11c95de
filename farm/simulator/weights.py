"""The weight routes of the scripted worker: SGLang's ``/update_weights_from_disk``,
``/update_weight_version``, ``/get_weight_version``, ``/pause_generation`` and
``/continue_generation``, and what a weight update means for a request in flight.

With a model (:mod:`.scoring`) a weight update loads the checkpoint for real; a reply
carries the version its logprobs were computed with, and a request that generation was
paused around while the weights changed is scored again under the new ones (SGLang's
``retract``). Without one, only the stamp changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from farm.simulator.job import Job, json_or_empty
from farm.simulator.protocol import error_body
from farm.simulator.scoring import Scorer
from farm.simulator.state import Inflight, WorkerStats


class WeightRoutes:
    """Mixed into ``ScriptedWorker`` (which owns these attributes)."""

    scorer: Scorer | None
    weight_version: str
    model_path: str
    inflight: dict[str, Inflight]
    stats: WorkerStats
    cache: Any
    _running: asyncio.Event

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await json_or_empty(request)
        path = body.get("model_path")
        if not isinstance(path, str) or not path:
            return web.json_response({"success": False, "message": "model_path is required",
                                      "num_paused_requests": 0}, status=400)
        if self.scorer is not None:  # load for real; a bad checkpoint leaves the served weights alone
            try:
                scorer = await asyncio.to_thread(self.scorer.load, path)
            except (OSError, ValueError) as exc:
                return web.json_response({"success": False, "message": f"Failed to load weights from {path}: {exc}",
                                          "num_paused_requests": 0}, status=400)
            self.scorer = scorer
        if body.get("abort_all_requests"):
            for state in self.inflight.values():
                state.message = "Abort for weight update"
                state.abort.set()
        self.model_path = path
        message = "Succeeded to update model weights."
        if body.get("weight_version") is not None:
            self.weight_version = str(body["weight_version"])
            message += f" Weight version updated to {self.weight_version}."
        self.cache.clear()
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        """SGLang's ``POST /update_weight_version {new_version, abort_all_requests}``: the
        trainer synced the weights itself (NCCL, tensors); only the stamp changes."""
        body = await json_or_empty(request)
        version = body.get("new_version")
        if not isinstance(version, str) or not version:
            return web.json_response({"success": False, "message": "new_version is required"}, status=400)
        if body.get("abort_all_requests"):
            self._abort_all("Abort for weight version update")
        self.weight_version = version
        return web.json_response({"success": True, "message": f"Weight version updated to {version}."})

    async def pause_generation(self, request: web.Request) -> web.Response:
        """SGLang's ``POST /pause_generation {mode}``: ``abort`` ends in-flight requests
        (finish_reason abort); ``retract`` / ``in_place`` keep them, frozen at their next
        decode step, until ``/continue_generation``. New requests wait too."""
        body = await json_or_empty(request)
        mode = body.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            return web.json_response(error_body(f"Invalid mode: {mode!r}. Expected one of "
                                                "['abort', 'retract', 'in_place'].", 400), status=400)
        self._running.clear()
        self.stats.pauses += 1
        if mode == "abort":
            self._abort_all("Abort for pause_generation")
        return web.Response(status=200)

    async def continue_generation(self, request: web.Request) -> web.Response:
        self._running.set()
        return web.Response(status=200)

    def _abort_all(self, message: str) -> None:
        for state in self.inflight.values():
            state.message = message
            state.abort.set()

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.weight_version})

    async def _rescore(self, job: Job) -> None:
        """Before a reply goes out: a request that generation was paused around while the
        weights changed resumes on the new weights (SGLang's retract recomputes it): its
        tokens stay, every logprob is computed again and the reply carries the new
        version. (A token sampled before the pause was drawn from the old weights, as in
        SGLang.) Without a pause (``weight_update_pause: none``) it keeps its version."""
        scorer, version = self.scorer, self.weight_version
        if (scorer is None or job.weight_version is None or job.weight_version == version
                or self.stats.pauses == job.pauses):
            return
        job.logprobs = await asyncio.to_thread(scorer.logprobs, job.input_ids, job.completion.output_ids,
                                               job.req.sampling_params.temperature)
        job.weight_version = version
        self.stats.rescored += 1
