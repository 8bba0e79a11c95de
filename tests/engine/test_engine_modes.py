"""RouterActor modes without Ray: external and router, plus the GPU-only launch mode's
command construction and its clear error when the ``sglang`` package is missing."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import aiohttp
import pytest

from engine_helpers import live_pids
from farm.actors.router import RouterActor, SGLangServerActor
from farm.engine.config import EngineConfig, LaunchConfig
from farm.engine.launchers import sglang_server_argv, start_scripted_worker
from farm.simulator import ScriptedPolicy
from farm.modeltext.tokenizer import load_tokenizer, resolve_tokenizer
from farm.errors import ConfigError, EngineError


async def test_external_mode_checks_health_and_updates_weights(make_worker):
    worker, url = await make_worker(ScriptedPolicy())
    actor = RouterActor(EngineConfig(mode="external", url=url + "/"))
    try:
        assert await actor.start() == url
        health = await actor.health()
        assert health.healthy and [w.url for w in health.workers] == [url]
        update = await actor.update_weights_from_disk("/ckpt/2")
        assert update.policy_version == 1 and worker.weight_version == "1" and worker.model_path == "/ckpt/2"
        with pytest.raises(EngineError):
            await actor.add_worker("http://127.0.0.1:9")
    finally:
        await actor.shutdown()
    assert (await actor.health()).reason == "not started"


async def test_external_mode_refuses_a_dead_url():
    actor = RouterActor(EngineConfig(mode="external", url="http://127.0.0.1:9", health_timeout_s=2))
    with pytest.raises(EngineError, match="not healthy"):
        await actor.start()


@pytest.mark.slow
async def test_router_mode_fronts_given_workers_and_leaves_them_running(tok_path, tmp_path):
    proc, url = await start_scripted_worker({"policy": "noop", "tokenizer": tok_path}, log_dir=tmp_path,
                                            name="ext-w", timeout=60)
    try:
        actor = RouterActor(EngineConfig(mode="router", worker_urls=[url]))
        base = await actor.start()
        router_pid = actor.processes()["router"]
        async with aiohttp.ClientSession() as s:
            async with s.post(base + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 3}},
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200
        assert [w.url for w in await actor.workers()] == [url]
        await actor.shutdown()
        assert not live_pids([router_pid])
        assert proc.alive()  # not ours to stop
    finally:
        await proc.astop()


def test_launch_mode_command_follows_sglang_cli():
    cfg = LaunchConfig(model_path="Qwen/Qwen3-8B", tp=4, mem_fraction_static=0.85, context_length=65536,
                       extra_args=["--enable-metrics"])
    argv = sglang_server_argv(cfg, host="0.0.0.0", port=30000, model_name="policy", python="/py")
    assert argv == ["/py", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--tp", "4",
                    "--host", "0.0.0.0", "--port", "30000", "--served-model-name", "policy",
                    "--mem-fraction-static", "0.85", "--context-length", "65536", "--enable-metrics"]
    with pytest.raises(EngineError, match="model_path"):
        sglang_server_argv(LaunchConfig(), host="h", port=1)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="sglang is installed here")
async def test_launch_mode_without_sglang_is_a_clear_error():
    server = SGLangServerActor(LaunchConfig(model_path="Qwen/Qwen3-8B"))
    with pytest.raises(EngineError, match=r"pip install 'farm\[sglang\]'"):
        await server.start()
    await server.stop()


async def test_simulator_mode_needs_tasks_for_oracle(tok_path):
    actor = RouterActor(EngineConfig(mode="simulator", policy="oracle", tokenizer=tok_path))
    with pytest.raises(EngineError, match="needs tasks"):
        await actor.start()
    assert actor.processes() == {}


def test_tokenizer_specs(tmp_path, tok_path):
    assert resolve_tokenizer(tok_path) == tok_path
    built = resolve_tokenizer("builtin:farm-test", tmp_path)
    assert built == str(tmp_path / "farm-test") and (tmp_path / "farm-test" / "tokenizer.json").exists()
    with pytest.raises(ConfigError):
        resolve_tokenizer("builtin:nope", tmp_path)


def test_a_generic_fast_tokenizer_loads_as_autotokenizer_would_without_torch(tmp_path, tok_path, monkeypatch):
    """A directory whose config names the generic fast class (the builtin ones) loads that
    class directly: the same tokenizer AutoTokenizer gives, without importing its mapping of
    every model (and torch with it) in each gateway and scripted worker."""
    from transformers import AutoTokenizer

    tok, auto = load_tokenizer(tok_path), AutoTokenizer.from_pretrained(tok_path)
    assert type(tok) is type(auto) and tok.init_kwargs == auto.init_kwargs and len(tok) == len(auto)
    text = "héllo <|im_end|> <tool_call>{}</tool_call>"
    assert tok(text) == auto(text) and tok.decode(range(300)) == auto.decode(range(300))
    script = "import sys; from farm.modeltext.tokenizer import load_tokenizer; load_tokenizer(sys.argv[1]); " \
             "print(sorted(m for m in ('torch', 'transformers.models.auto') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", script, tok_path], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr
    # a model's own class (or anything else) still goes through AutoTokenizer
    own = tmp_path / "own"
    shutil.copytree(tok_path, own)
    config = json.loads((own / "tokenizer_config.json").read_text())
    (own / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "Qwen2Tokenizer"}))
    asked = []
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda path, **kw: asked.append(path) or auto)
    assert load_tokenizer(str(own)) is auto and asked == [str(own)]
