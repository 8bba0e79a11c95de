"""Gateway test kit: capture fixtures, a gateway over a real scripted worker, SSE checkers."""

from __future__ import annotations

import contextlib
import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from farm.engine.client import EngineClient
from farm.engine.config import FaultConfig, LatencyConfig
from farm.simulator import ScriptedPolicy, ScriptedWorker, WorkerSettings, serve_worker
from farm.engine.config import EngineClientConfig
from farm.gateway.config import GatewayConfig
from farm.gateway.gateway import Gateway
from farm.modeltext.toolcalls import ToolCall, get_format

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"
PATHS = {"anthropic": "/v1/messages?beta=true", "responses": "/v1/responses", "chat": "/v1/chat/completions"}


def capture(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / name).read_text())


def all_captures() -> list[str]:
    return sorted(str(p.relative_to(CAPTURES)) for p in CAPTURES.glob("*/*.json"))


def protocol_of(cap: dict[str, Any]) -> str | None:
    path = cap["path"]
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path == "/v1/responses":
        return "responses"
    if path == "/v1/chat/completions":
        return "chat"
    return None


# ---- a gateway over a scripted worker --------------------------------------------
@dataclass
class Env:
    gw: Gateway
    policy: ScriptedPolicy
    worker: ScriptedWorker
    http: aiohttp.ClientSession
    engine_url: str

    async def post(self, protocol_or_path: str, body: Any, secret: str | None, *, headers: dict[str, str] | None = None,
                   raw: bytes | None = None) -> tuple[int, str, dict[str, str]]:
        path = PATHS.get(protocol_or_path, protocol_or_path)
        hdrs = {"Content-Type": "application/json"}
        if secret is not None:
            if protocol_or_path == "anthropic":
                hdrs["x-api-key"] = secret
            else:
                hdrs["Authorization"] = f"Bearer {secret}"
        hdrs.update(headers or {})
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.http.post(self.gw.base_url + path, data=data, headers=hdrs) as resp:
            return resp.status, await resp.text(), dict(resp.headers)

    def script(self, session_id: str, *texts: str) -> None:
        self.policy.push(*texts, routing_key=session_id)


@contextlib.asynccontextmanager
async def gateway_env(tokenizer: Any, *, tool_format: str = "hermes", faults: FaultConfig | None = None,
                      latency: LatencyConfig | None = None, client: EngineClientConfig | None = None,
                      moe: Any = None, **config: Any) -> AsyncIterator[Env]:
    policy = ScriptedPolicy()
    settings = WorkerSettings(faults=faults or FaultConfig(), latency=latency or LatencyConfig(), moe=moe)
    worker = ScriptedWorker(tokenizer, policy, settings)
    cfg = GatewayConfig(**config)
    if client is not None:
        cfg = cfg.model_copy(update={"engine_client": client})
    async with serve_worker(worker) as url, EngineClient(url, cfg.engine_client, seed=0) as engine:
        async with Gateway(cfg, tokenizer, engine, tool_format) as gw, aiohttp.ClientSession() as http:
            yield Env(gw, policy, worker, http, url)


async def turn(env: Env, conv: "Conversation", secret: str, sid: str, text: str, *, expect: int = 200) -> dict[str, Any]:
    """One model turn as the CLI makes it: script the reply, send the conversation, check
    the stream; returns the parsed reply ({} for an expected error status)."""
    env.script(sid, text)
    body = conv.request()
    status, out, _ = await env.post(conv.protocol, body, secret)
    assert status == expect, out
    return check_stream(conv.protocol, out, body) if status == 200 else {}


# ---- what the model says ------------------------------------------------------------
def reply_text(content: str = "", calls: list[tuple[str, dict[str, Any]]] = (), *, reasoning: str | None = None,
               tool_format: str = "hermes") -> str:
    """A model output in the model's own format (the worker appends EOS)."""
    fmt = get_format(tool_format)
    parts = []
    if reasoning:
        parts.append(f"<think>\n{reasoning}\n</think>\n\n")
    body = content
    if calls:
        rendered = fmt.render([ToolCall(f"c{i}", n, a) for i, (n, a) in enumerate(calls)])
        body = f"{content}\n{rendered}" if content else rendered
    return "".join(parts) + body


# ---- SSE ------------------------------------------------------------------------------
def parse_sse(text: str) -> list[tuple[str | None, Any]]:
    """[(event name or None, parsed data or the raw string)], comments skipped."""
    events = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if not data:
            continue
        raw = "\n".join(data)
        events.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return events


def check_anthropic_stream(text: str) -> dict[str, Any]:
    """Validate the event grammar Claude Code consumes; returns the assembled message."""
    events = parse_sse(text)
    names = [e for e, _ in events]
    assert names[0] == "message_start", names
    assert names[-1] == "message_stop" and names[-2] == "message_delta", names
    for name, data in events:
        assert data["type"] == name
    msg = events[0][1]["message"]
    blocks: list[dict[str, Any]] = []
    open_index = None
    for name, data in events[1:-2]:
        if name == "ping":
            continue
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(copy.deepcopy(data["content_block"]))
            if blocks[-1]["type"] == "tool_use":
                blocks[-1]["_json"] = ""
        elif name == "content_block_delta":
            assert data["index"] == open_index
            d, b = data["delta"], blocks[open_index]
            kind = d["type"]
            if kind == "text_delta":
                b["text"] += d["text"]
            elif kind == "thinking_delta":
                b["thinking"] += d["thinking"]
            elif kind == "signature_delta":
                b["signature"] += d["signature"]
            elif kind == "input_json_delta":
                b["_json"] += d["partial_json"]
            else:
                raise AssertionError(f"unknown delta {kind}")
        elif name == "content_block_stop":
            assert data["index"] == open_index
            b = blocks[open_index]
            if b["type"] == "tool_use":
                b["input"] = json.loads(b.pop("_json") or "{}")
            open_index = None
        else:
            raise AssertionError(f"unexpected event {name}")
    assert open_index is None
    final = events[-2][1]
    assert final["delta"]["stop_reason"] in ("end_turn", "tool_use", "max_tokens", "stop_sequence")
    msg["content"] = blocks
    msg["stop_reason"] = final["delta"]["stop_reason"]
    msg["usage"] = final["usage"]
    return msg


def check_responses_stream(text: str) -> dict[str, Any]:
    """Validate the Responses event grammar Codex consumes; returns the final response."""
    events = parse_sse(text)
    assert events[0][0] == "response.created", events[0]
    seqs = [d["sequence_number"] for _, d in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    for name, data in events:
        assert data["type"] == name
    added: dict[int, dict[str, Any]] = {}
    done: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "response.output_item.added":
            assert data["output_index"] not in added
            added[data["output_index"]] = data["item"]
        elif name == "response.output_item.done":
            assert data["output_index"] in added and data["output_index"] not in done
            assert data["item"]["id"] == added[data["output_index"]]["id"]
            done[data["output_index"]] = data["item"]
        elif name.endswith(".delta"):
            assert data["output_index"] in added and data["output_index"] not in done
    assert sorted(added) == sorted(done) == list(range(len(done)))
    last_name, last = events[-1]
    assert last_name in ("response.completed", "response.incomplete"), last_name
    resp = last["response"]
    assert resp["output"] == [done[i] for i in range(len(done))]
    assert resp["usage"]["total_tokens"] == resp["usage"]["input_tokens"] + resp["usage"]["output_tokens"]
    return resp


def check_chat_stream(text: str, *, include_usage: bool) -> dict[str, Any]:
    """Validate the chunk grammar OpenCode consumes; returns the assembled message."""
    events = parse_sse(text)
    assert events[-1][1] == "[DONE]"
    chunks = [d for _, d in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    usage = None
    if include_usage:
        assert chunks[-1]["choices"] == [] and "usage" in chunks[-1]
        usage = chunks.pop()["usage"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert all(f is None for f in finishes[:-1]) and finishes[-1] in ("stop", "length", "tool_calls")
    msg: dict[str, Any] = {"content": "", "reasoning": "", "tool_calls": {}}
    for c in chunks:
        d = c["choices"][0]["delta"]
        msg["content"] += d.get("content") or ""
        msg["reasoning"] += d.get("reasoning_content") or ""
        for tc in d.get("tool_calls") or ():
            slot = msg["tool_calls"].setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
            slot["id"] = tc.get("id") or slot["id"]
            slot["name"] += tc["function"].get("name") or ""
            slot["arguments"] += tc["function"].get("arguments") or ""
    msg["tool_calls"] = [msg["tool_calls"][i] for i in sorted(msg["tool_calls"])]
    msg["finish_reason"] = finishes[-1]
    msg["usage"] = usage
    return msg


def check_stream(protocol: str, text: str, body: dict[str, Any]) -> dict[str, Any]:
    if protocol == "anthropic":
        return check_anthropic_stream(text)
    if protocol == "responses":
        return check_responses_stream(text)
    return check_chat_stream(text, include_usage=bool((body.get("stream_options") or {}).get("include_usage")))


# ---- turn-1 requests and replies from turn-2 captures --------------------------------
def split_turn2(protocol: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], str]:
    """(turn-1 body, the tool calls the model made in turn 1, its text) from a turn-2 body."""
    body = copy.deepcopy(body)
    if protocol == "anthropic":
        msgs = body["messages"]
        echo = msgs[-2]
        body["messages"] = msgs[:-2]
        calls = [(b["name"], b["input"]) for b in echo["content"] if b["type"] == "tool_use"]
        text = "".join(b.get("text", "") for b in echo["content"] if b["type"] == "text")
        return body, calls, text
    if protocol == "responses":
        items = body["input"]
        cut = max(i for i, it in enumerate(items) if it.get("role") in ("user", "developer", "system"))
        tail = items[cut + 1:]
        body["input"] = items[: cut + 1]
        calls = []
        for it in tail:
            if it.get("type") == "function_call":
                calls.append((it["name"], json.loads(it["arguments"])))
            elif it.get("type") == "custom_tool_call":
                calls.append((it["name"], {"input": it["input"]}))
        return body, calls, ""
    msgs = body["messages"]
    cut = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    echo = msgs[cut]
    body["messages"] = msgs[:cut]
    calls = [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in echo.get("tool_calls") or ()]
    return body, calls, echo.get("content") or ""


# ---- a minimal client per protocol: keeps the conversation the way the CLI does ------
TOOLS = {
    "anthropic": [{"name": "Bash", "description": "Run a shell command",
                   "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                                    "required": ["command"]}}],
    "responses": [{"type": "function", "name": "exec_command", "description": "Run a shell command",
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
                  {"type": "custom", "name": "apply_patch", "description": "Edit files (freeform)",
                   "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}],
    "chat": [{"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                               "parameters": {"type": "object",
                                                              "properties": {"command": {"type": "string"}}}}}],
}  # fmt: skip
SHELL = {"anthropic": ("Bash", "command"), "responses": ("exec_command", "cmd"), "chat": ("bash", "command")}


class Conversation:
    """Builds requests like the CLI does and echoes replies back like it does."""

    def __init__(self, protocol: str, task: str = "Fix the failing test in calc.py", *, system: str = "You are a coding agent."):
        self.protocol = protocol
        if protocol == "anthropic":
            self.body: dict[str, Any] = {"model": "m", "max_tokens": 4096, "stream": True,
                                         "system": [{"type": "text", "text": system}],
                                         "messages": [{"role": "user", "content": [{"type": "text", "text": task}]}],
                                         "tools": TOOLS[protocol]}  # fmt: skip
        elif protocol == "responses":
            self.body = {"model": "m", "stream": True, "tools": TOOLS[protocol],
                         "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": system}]},
                                   {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]}]}  # fmt: skip
        else:
            self.body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}, "tools": TOOLS[protocol],
                         "messages": [{"role": "system", "content": system}, {"role": "user", "content": task}]}  # fmt: skip

    def request(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def calls(self, reply: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        """(call id, name, arguments) of the reply's tool calls."""
        if self.protocol == "anthropic":
            return [(b["id"], b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"]
        if self.protocol == "responses":
            out = []
            for it in reply["output"]:
                if it["type"] == "function_call":
                    out.append((it["call_id"], it["name"], json.loads(it["arguments"])))
                elif it["type"] == "custom_tool_call":
                    out.append((it["call_id"], it["name"], {"input": it["input"]}))
            return out
        return [(c["id"], c["name"], json.loads(c["arguments"])) for c in reply["tool_calls"]]

    def echo(self, reply: dict[str, Any], results: list[str], *, user_text: str | None = None) -> None:
        """Append the reply as the CLI echoes it, then the tool results (and maybe user text)."""
        calls = self.calls(reply)
        if self.protocol == "anthropic":
            content = [{k: v for k, v in b.items()} for b in reply["content"]]
            self.body["messages"].append({"role": "assistant", "content": content})
            blocks: list[dict[str, Any]] = [{"tool_use_id": cid, "type": "tool_result", "content": r, "is_error": False}
                                            for (cid, _, _), r in zip(calls, results)]  # fmt: skip
            if user_text:
                blocks.append({"type": "text", "text": user_text})
            if blocks:
                self.body["messages"].append({"role": "user", "content": blocks})
        elif self.protocol == "responses":
            for it in reply["output"]:
                if it["type"] == "reasoning":  # Codex drops reasoning_text content when echoing
                    self.body["input"].append({"type": "reasoning", "id": it["id"], "summary": [],
                                               "encrypted_content": None})  # fmt: skip
                else:
                    self.body["input"].append(copy.deepcopy(it))
            for (cid, name, _), r in zip(calls, results):
                kind = "custom_tool_call_output" if name == "apply_patch" else "function_call_output"
                self.body["input"].append({"type": kind, "call_id": cid, "output": r})
            if user_text:
                self.body["input"].append({"type": "message", "role": "user",
                                           "content": [{"type": "input_text", "text": user_text}]})  # fmt: skip
        else:
            msg: dict[str, Any] = {"role": "assistant", "content": reply["content"]}
            if calls:  # OpenCode re-serializes arguments compactly
                msg["tool_calls"] = [{"id": cid, "type": "function",
                                      "function": {"name": n, "arguments": json.dumps(a, separators=(",", ":"))}}
                                     for cid, n, a in calls]  # fmt: skip
            self.body["messages"].append(msg)
            for (cid, _, _), r in zip(calls, results):
                self.body["messages"].append({"role": "tool", "tool_call_id": cid, "content": r})
            if user_text:
                self.body["messages"].append({"role": "user", "content": user_text})
