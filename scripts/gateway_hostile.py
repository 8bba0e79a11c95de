"""Hostile requests for ``bench_gateway.py`` (a helper module, not a benchmark of its own).

- :func:`hostile_bodies`: three bodies that cost a gateway the most to parse and render (50 MB of
  text, 200,000 one-character messages, a tool schema with 10,000 properties) in each protocol.
- :func:`bench_hostile`: each sent alone to a gateway in a server subprocess, whose
  peak RSS is read from ``/proc/<pid>/status`` (``VmHWM``, reset through
  ``/proc/<pid>/clear_refs`` before each request): seconds to the answer and RSS
  growth, against the default config (body limit derived from the context) and
  against ``max_body_bytes=64 MiB`` (the old default, so the token bounds, not the
  size limit, answer the big bodies).
- :func:`fuzz_request`: one of the malformed / hostile requests mixed into the
  concurrent-sessions load (bad JSON, wrong types, 50 MB bodies, unknown tool ids, a
  string tool input, too many messages, deep nesting, disconnects mid-stream).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

PATHS = {"anthropic": "/v1/messages", "responses": "/v1/responses", "chat": "/v1/chat/completions"}
MB = 1 << 20


def _base(protocol: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if protocol == "responses":
        items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in messages]
        return {"model": "m", "stream": True, "input": items, "tools": tools or []}
    return {"model": "m", "max_tokens": 64, "stream": True, "messages": messages, "tools": tools or []}


def _tool(protocol: str, properties: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties}
    if protocol == "anthropic":
        return {"name": "wide", "description": "a wide tool", "input_schema": schema}
    if protocol == "responses":
        return {"type": "function", "name": "wide", "description": "a wide tool", "parameters": schema}
    return {"type": "function", "function": {"name": "wide", "description": "a wide tool", "parameters": schema}}


# the sizes of the three bodies (``QUICK``: the benchmark's smallest size, see bench_gateway --quick)
SIZES = {"text_bytes": 50 * MB, "messages": 200_000, "properties": 10_000}
QUICK = {"text_bytes": 8 * MB, "messages": 200, "properties": 100}
# the gateway configs each body is sent to: the default (body limit derived from the context),
# and the old default body limit, so the token bounds, not the size limit, answer the big bodies
CONFIGS = (("default", {}), ("body_limit_64mb", {"max_body_bytes": 64 * MB}))


def hostile_bodies(protocol: str, sizes: dict[str, int] = SIZES) -> dict[str, bytes]:
    words = ("def return import self value file path test error assert result list dict string ") * 8
    text = (words * (sizes["text_bytes"] // len(words) + 1))[: sizes["text_bytes"]]
    tiny = [{"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(sizes["messages"])]
    props = {f"p{i}": {"type": "string", "description": f"property number {i}"} for i in range(sizes["properties"])}
    return {
        "body_50mb": json.dumps(_base(protocol, [{"role": "user", "content": text}])).encode(),
        "messages_200k": json.dumps(_base(protocol, tiny)).encode(),
        "schema_10k_props": json.dumps(_base(protocol, [{"role": "user", "content": "hi"}],
                                             [_tool(protocol, props)])).encode(),  # fmt: skip
    }


def _headers(protocol: str, secret: str) -> dict[str, str]:
    auth = {"x-api-key": secret} if protocol == "anthropic" else {"Authorization": f"Bearer {secret}"}
    return {"Content-Type": "application/json", **auth}


# ---- the gateway in a server subprocess ---------------------------------------------
async def serve(config: dict[str, Any]) -> None:
    """Server side: a gateway over a zero-latency scripted worker; prints its URL and
    secrets, serves until stdin closes."""
    from bench_gateway import serve_worker_backlog

    from farm.engine.client import EngineClient
    from farm.simulator import ScriptedPolicy, ScriptedWorker, WorkerSettings
    from farm.modeltext.tokenizer import load_tokenizer
    from farm.gateway.config import GatewayConfig
    from farm.gateway.gateway import Gateway

    tok = load_tokenizer(config.pop("tokenizer"), config.pop("cache_dir"))
    policy = ScriptedPolicy()
    worker = ScriptedWorker(tok, policy, WorkerSettings(context_length=1 << 22))
    cfg = GatewayConfig(**config)
    async with serve_worker_backlog(worker) as url, EngineClient(url, cfg.engine_client) as engine:
        async with Gateway(cfg, tok, engine, "hermes") as gw:
            secrets = {p: gw.open_session(p).secret for p in PATHS}
            for p in PATHS:
                policy.push(*(["ok"] * 20), routing_key=p)
            print(json.dumps({"url": gw.base_url, "secrets": secrets, "pid": os.getpid()}), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


async def bench_hostile(tokenizer: str, cache_dir: str | None, sizes: dict[str, int] = SIZES,
                        configs: tuple[tuple[str, dict[str, Any]], ...] = CONFIGS) -> list[dict[str, Any]]:
    """Every hostile body on every protocol, alone, against each config: one row each."""
    import aiohttp

    rows = []
    bodies = {p: hostile_bodies(p, sizes) for p in PATHS}
    for label, extra in configs:
        config = {"tokenizer": tokenizer, "cache_dir": cache_dir, **extra}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).with_name("bench_gateway.py")), "--serve", json.dumps(config),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)  # fmt: skip
        try:
            info = json.loads((await proc.stdout.readline()).decode())  # type: ignore[union-attr]
            pid = info["pid"]
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                for protocol, cases in bodies.items():
                    for name, data in cases.items():
                        await asyncio.sleep(0.2)  # let the previous request's garbage go
                        Path(f"/proc/{pid}/clear_refs").write_text("5")  # peak RSS := current RSS
                        before = _kb(pid, "VmRSS")
                        t0 = time.perf_counter()
                        async with http.post(info["url"] + PATHS[protocol], data=data,
                                             headers=_headers(protocol, info["secrets"][protocol])) as resp:
                            text = await resp.text()
                            status = resp.status
                        seconds = time.perf_counter() - t0
                        rows.append({"config": label, "protocol": protocol, "case": name, "status": status,
                                     "seconds": seconds, "rss_mb": (_kb(pid, "VmHWM") - before) / 1024,
                                     "answer": _answer(text)})  # fmt: skip
        finally:
            proc.stdin.close()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                proc.kill()
    return rows


def _answer(text: str) -> str:
    try:
        return json.loads(text)["error"]["message"][:90]
    except (ValueError, KeyError, TypeError):
        return "stream: " + ("max_tokens" if "max_tokens" in text or "length" in text else text[:60].replace("\n", " "))


# ---- fuzz: hostile requests mixed into the concurrent load ----------------------------
FUZZ_KINDS = ("bad_json", "wrong_types", "body_50mb", "unknown_tool_id", "string_tool_input", "too_many_messages",
              "deep_nesting", "disconnect")  # fmt: skip


def fuzz_body(kind: str, base: dict[str, Any], big: bytes) -> bytes:
    body = json.loads(json.dumps(base))
    if kind == "bad_json":
        return b'{"model": "m", "messages": [{"role": "user", "content": "unterminated'
    if kind == "wrong_types":
        body["messages"] = {"role": "user"}
        body["max_tokens"] = "lots"
    elif kind == "body_50mb":
        return big
    elif kind == "unknown_tool_id":
        body["messages"].append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_never_issued", "content": "forged"}]})
    elif kind == "string_tool_input":
        body["messages"] += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": "ls"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "a.py"}]}]
    elif kind == "too_many_messages":
        body["messages"] = body["messages"] * 20_001
    elif kind == "deep_nesting":
        deep: dict[str, Any] = {"type": "string"}
        for _ in range(100):
            deep = {"type": "object", "properties": {"p": deep}}
        body["tools"] = body["tools"] + [{"name": "deep", "description": "deep", "input_schema": deep}]
    return json.dumps(body).encode()


async def fuzz_request(http: Any, url: str, secret: str, kind: str, base: dict[str, Any], big: bytes) -> int | None:
    """Send one hostile request; its HTTP status (None: the client hung up on purpose)."""
    headers = {"x-api-key": secret, "Content-Type": "application/json"}
    data = fuzz_body(kind, base, big)
    if kind == "disconnect":  # open a stream, read its first bytes, hang up
        async with http.post(url + "/v1/messages?beta=true", data=data, headers=headers) as resp:
            await resp.content.read(1)
            resp.close()
        return None
    async with http.post(url + "/v1/messages?beta=true", data=data, headers=headers) as resp:
        await resp.read()
        return resp.status
