"""The oracle, through the real gateway, solves a real task in each CLI's wire protocol and
tool vocabulary: its tool calls parse into native tool calls the CLI would execute."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from simulator_helpers import FIXTURES
from farm.engine.client import EngineClient
from farm.simulator import ScriptedWorker, WorkerSettings, serve_worker
from farm.simulator.oracle import OraclePolicy
from farm.gateway.config import GatewayConfig
from farm.gateway.gateway import Gateway
from farm.tasks.model import GitSource, Task

INSTRUCTION = "Fix greet() in hello.py: it must return 'Hello, <name>!' with an exclamation mark."


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def make_task(tmp_path: Path) -> tuple[Path, Task]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "hello.py").write_text("def greet(name):\n    return 'Hello, ' + name + '.'\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "hello.py").write_text("def greet(name):\n    return 'Hello, ' + name + '!'\n")
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "hello.py")
    test = "python -c \"import hello; assert hello.greet('Ann') == 'Hello, Ann!'; print('1 passed')\""
    return repo, Task(id="hello-1", instruction=INSTRUCTION, workspace=GitSource(url=str(repo), base_commit=base),
                      gold_patch=patch, test_command=test)


def run(repo: Path, command: Any) -> str:
    argv = command if isinstance(command, list) else ["bash", "-c", command]
    res = subprocess.run(argv, cwd=repo, capture_output=True, text=True, timeout=60)
    return (res.stdout + res.stderr) or "(no output)"


def tools(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"tools_{name}.json").read_text())


# Each driver: (first request, reply -> (calls [(id, name, args)], next request given outputs)).
class Claude:
    path, auth = "/v1/messages?beta=true", "x-api-key"

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": INSTRUCTION}]}]

    def request(self) -> dict[str, Any]:
        return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": False, "tools": tools("claude_code"),
                "system": [{"type": "text", "text": "You are Claude Code."}], "messages": self.messages}

    def calls(self, reply: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        self.messages.append({"role": "assistant", "content": reply["content"]})
        return [(b["id"], b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"]

    def answer(self, results: list[tuple[str, str]]) -> None:
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": cid, "content": out} for cid, out in results]})

    def final_text(self, reply: dict[str, Any]) -> str:
        return "".join(b.get("text", "") for b in reply["content"] if b["type"] == "text")


class Codex:
    path, auth = "/v1/responses", "Authorization"

    def __init__(self) -> None:
        self.input: list[dict[str, Any]] = [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": INSTRUCTION}]}]

    def request(self) -> dict[str, Any]:
        return {"model": "gpt-5-codex", "stream": False, "store": False, "parallel_tool_calls": True,
                "tools": tools("codex"), "input": self.input}

    def calls(self, reply: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        self.input.extend(reply["output"])
        return [(i["call_id"], i["name"], json.loads(i["arguments"])) for i in reply["output"]
                if i["type"] == "function_call"]

    def answer(self, results: list[tuple[str, str]]) -> None:
        self.input.extend({"type": "function_call_output", "call_id": cid, "output": out} for cid, out in results)

    def final_text(self, reply: dict[str, Any]) -> str:
        return "".join(c["text"] for i in reply["output"] if i["type"] == "message" for c in i["content"])


class OpenCode:
    path, auth = "/v1/chat/completions", "Authorization"

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are opencode."},
                                               {"role": "user", "content": INSTRUCTION}]

    def request(self) -> dict[str, Any]:
        return {"model": "farm-policy", "stream": False, "tools": tools("opencode"), "messages": self.messages}

    def calls(self, reply: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
        msg = reply["choices"][0]["message"]
        self.messages.append(msg)
        return [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in msg.get("tool_calls") or []]

    def answer(self, results: list[tuple[str, str]]) -> None:
        self.messages.extend({"role": "tool", "tool_call_id": cid, "content": out} for cid, out in results)

    def final_text(self, reply: dict[str, Any]) -> str:
        return reply["choices"][0]["message"]["content"]


SHELL = {"claude_code": (Claude, "Bash", "command"), "codex": (Codex, "exec_command", "cmd"),
         "opencode": (OpenCode, "bash", "command")}


@pytest.mark.parametrize("harness", sorted(SHELL))
@pytest.mark.parametrize("tool_format", ["hermes", "qwen3_coder"])
async def test_oracle_through_gateway(harness, tool_format, hf_tokenizer, tmp_path):
    repo, task = make_task(tmp_path)
    driver_cls, shell, arg = SHELL[harness]
    driver = driver_cls()
    worker = ScriptedWorker(hf_tokenizer, OraclePolicy([task], tool_format=tool_format), WorkerSettings())
    async with serve_worker(worker) as url, EngineClient(url) as engine:
        async with Gateway(GatewayConfig(), hf_tokenizer, engine, tool_format) as gw, aiohttp.ClientSession() as http:
            handle = gw.open_session("rollout-1")
            auth = handle.secret if driver.auth == "x-api-key" else f"Bearer {handle.secret}"
            turns = []
            for _ in range(6):
                async with http.post(gw.base_url + driver.path, json=driver.request(),
                                     headers={driver.auth: auth}) as r:
                    assert r.status == 200, await r.text()
                    reply = await r.json()
                calls = driver.calls(reply)
                turns.append(calls)
                if not calls:
                    break
                assert {name for _, name, _ in calls} == {shell}
                driver.answer([(cid, run(repo, args[arg])) for cid, _, args in calls])
            stats = gw.stats("rollout-1")
            await gw.close_session("rollout-1")
    assert [len(c) for c in turns] == [2, 1, 1, 0]  # parallel look, apply, test, summary
    assert "'!'" in (repo / "hello.py").read_text()
    assert "1 passed" in driver.final_text(reply)
    assert stats.tool_parse_errors == 0 and stats.turns == 4
    assert stats.appended == 3  # each turn extended the previous one (append-only)
    assert worker.stats.requests == 4
