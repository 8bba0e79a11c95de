"""Weight updates through the router actor (no Ray): generation paused on every worker
around the load, resumed even when the load fails, the version stamped on later replies;
SGLang's pause/continue/update_weight_version routes on the scripted worker."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from farm.actors.router import RouterActor
from farm.engine.config import EngineConfig, LatencyConfig
from farm.simulator import ScriptedPolicy
from farm.errors import EngineError
from testkit.waits import async_wait_until

REPLY = "Let me check the file first. Then I will fix the bug."


def _ids(tok) -> list[int]:
    return tok.apply_chat_template([{"role": "user", "content": "Fix it."}], add_generation_prompt=True,
                                   tokenize=True, return_dict=False)


async def _generate(http: aiohttp.ClientSession, url: str, ids: list[int]) -> dict:
    async with http.post(url + "/generate", json={"input_ids": ids, "return_logprob": True}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def test_update_pauses_loads_stamps_and_resumes(make_worker, http, hf_tokenizer):
    for worker, url in [await make_worker(ScriptedPolicy(default=REPLY))]:
        actor = RouterActor(EngineConfig(mode="external", url=url))
        try:
            await actor.start()
            update = await actor.update_weights("/ckpt/step-1")
            assert update.policy_version == 1 and worker.model_path == "/ckpt/step-1"
            assert worker.stats.pauses == 1 and worker._running.is_set()  # paused around the load, resumed
            out = await _generate(http, url, _ids(hf_tokenizer))
            assert out["meta_info"]["weight_version"] == "1"
            # the trainer synced the weights itself: only the stamp changes
            update = await actor.update_weights(version=5)
            assert update.policy_version == 5 and worker.weight_version == "5" and worker.model_path == "/ckpt/step-1"
            assert (await _generate(http, url, _ids(hf_tokenizer)))["meta_info"]["weight_version"] == "5"
            with pytest.raises(EngineError, match="older than the current 5"):
                await actor.update_weights(version=4)
            # a load that fails still resumes generation, and the version does not move
            with pytest.raises(EngineError, match="update_weights_from_disk failed"):
                await actor.update_weights("")
            assert worker._running.is_set() and actor.policy_version() == 5
            assert worker.stats.versions_served == {"1": 1, "5": 1}
        finally:
            await actor.shutdown()


async def test_pause_holds_generation_until_continue(make_worker, http, hf_tokenizer):
    worker, url = await make_worker(ScriptedPolicy(default=REPLY), latency=LatencyConfig(tokens_per_s=200))
    async with http.post(url + "/pause_generation", json={"mode": "retract"}) as r:
        assert r.status == 200
    pending = asyncio.ensure_future(_generate(http, url, _ids(hf_tokenizer)))
    done, _ = await asyncio.wait({pending}, timeout=0.5)
    assert not done  # held while paused (however slow the machine, it cannot finish)
    async with http.post(url + "/update_weight_version", json={"new_version": "3"}) as r:
        assert r.status == 200 and (await r.json())["success"] is True
    async with http.post(url + "/continue_generation", json={}) as r:
        assert r.status == 200
    out = await asyncio.wait_for(pending, 60)
    assert out["meta_info"]["finish_reason"]["type"] == "stop" and out["meta_info"]["weight_version"] == "3"
    async with http.post(url + "/pause_generation", json={"mode": "sideways"}) as r:
        assert r.status == 400 and "Invalid mode" in (await r.json())["message"]
    async with http.post(url + "/update_weight_version", json={}) as r:
        assert r.status == 400


async def test_pause_in_abort_mode_ends_running_requests(make_worker, http, hf_tokenizer):
    worker, url = await make_worker(ScriptedPolicy(default=REPLY * 20), latency=LatencyConfig(tokens_per_s=50))
    pending = asyncio.ensure_future(_generate(http, url, _ids(hf_tokenizer)))
    await async_wait_until(lambda: worker.inflight, timeout_s=10, what="the request in flight")
    async with http.post(url + "/pause_generation", json={"mode": "abort"}) as r:
        assert r.status == 200
    out = await asyncio.wait_for(pending, 60)
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    async with http.post(url + "/continue_generation", json={}) as r:
        assert r.status == 200
    assert (await _generate(http, url, _ids(hf_tokenizer)))["meta_info"]["finish_reason"]["type"] in ("stop", "length")
