"""Per-CLI command, env and config construction, and reading each CLI's real JSON output.

The stdout fixtures are what the real CLIs printed (tests/fixtures/harnesses): runs
against a logging endpoint, a 401 from a closed session, an unreachable endpoint.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from farm.harnesses import make_harness
from farm.harnesses.base import HarnessRun, diff_excludes
from farm.harnesses.claude_code import MODEL_ALIAS_VARS, ClaudeCodeHarness
from farm.harnesses.codex import KEY_VAR as CODEX_KEY, CodexHarness
from farm.harnesses.config import PINNED_VERSIONS, HarnessConfig
from farm.harnesses.events import last_line, parse_json_lines, tail
from farm.harnesses.opencode import KEY_VAR as OPENCODE_KEY, OFFLINE_ENV, OpenCodeHarness
from farm.harnesses.probe import probe_script

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harnesses"
SCRATCH = "/sb/root/.farm/harness"


def events_of(name: str) -> list[dict]:
    events, _ = parse_json_lines((FIXTURES / name).read_text())
    return events


@pytest.fixture
def run() -> HarnessRun:
    return HarnessRun(
        instruction="Fix the bug.\nIt is in calc.py.",
        gateway_url="http://127.0.0.1:8123/",
        api_key="s3cret-key",
        model="Qwen/Qwen3-8B",
        workdir="/sb/root/repo",
        budget_s=60,
        env={"PATH": "/venv/bin:/usr/bin:/bin", "ANTHROPIC_BASE_URL": "http://wrong"},
    )


def test_make_harness_and_pins() -> None:
    for name, cls in (("claude_code", ClaudeCodeHarness), ("codex", CodexHarness), ("opencode", OpenCodeHarness)):
        h = make_harness(HarnessConfig(name=name))
        assert isinstance(h, cls) and h.name == name
        assert h.package.version == PINNED_VERSIONS[name]
    h = make_harness(HarnessConfig(name="codex", versions={"codex": "0.170.0"}))
    assert h.package.spec == "@openai/codex@0.170.0"
    assert HarnessConfig().versions == PINNED_VERSIONS
    with pytest.raises(ValueError):
        HarnessConfig(name="aider")  # type: ignore[arg-type]


def test_claude_code_command_and_env(run: HarnessRun) -> None:
    h = ClaudeCodeHarness(HarnessConfig(name="claude_code", max_output_tokens=4096))
    args = h.arguments(run)
    assert args[:4] == ["--print", "--output-format", "stream-json", "--verbose"]
    assert args[args.index("--model") + 1] == run.model
    assert "--dangerously-skip-permissions" in args
    assert args[args.index("--disallowedTools") + 1] == "WebFetch,WebSearch"
    assert run.instruction not in args  # the instruction goes on stdin
    env = h.environment(run, SCRATCH)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"
    assert env["ANTHROPIC_API_KEY"] == "s3cret-key"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
    assert env["IS_SANDBOX"] == "1"
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "4096"
    assert {var: env[var] for var in MODEL_ALIAS_VARS} == {var: run.model for var in MODEL_ALIAS_VARS}
    assert "ANTHROPIC_SMALL_FAST_MODEL" in MODEL_ALIAS_VARS and "CLAUDE_CODE_SUBAGENT_MODEL" in MODEL_ALIAS_VARS
    assert h.config_files(run, SCRATCH) == {}


def test_codex_command_env_and_config_toml(run: HarnessRun) -> None:
    h = CodexHarness(HarnessConfig(name="codex", context_window=65536))
    args = h.arguments(run)
    assert args[0] == "exec"
    for flag in ("--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", "--json"):
        assert flag in args
    assert "plugins" in args and "apps" in args and "analytics.enabled=false" in args
    env = h.environment(run, SCRATCH)
    assert env == {"CODEX_HOME": f"{SCRATCH}/codex-home", CODEX_KEY: "s3cret-key"}
    files = h.config_files(run, SCRATCH)
    assert list(files) == [f"{SCRATCH}/codex-home/config.toml"]
    toml = tomllib.loads(files[f"{SCRATCH}/codex-home/config.toml"])
    assert toml["model"] == run.model and toml["model_provider"] == "farm"
    assert toml["web_search"] == "disabled"
    assert toml["model_context_window"] == 65536
    provider = toml["model_providers"]["farm"]
    assert provider == {
        "name": "farm",
        "base_url": "http://127.0.0.1:8123/v1",
        "env_key": CODEX_KEY,
        "wire_api": "responses",
    }
    assert "s3cret-key" not in files[f"{SCRATCH}/codex-home/config.toml"]  # the secret lives in env only


def test_codex_toml_escapes_odd_model_names(run: HarnessRun) -> None:
    odd = run.model_copy(update={"model": 'we"ird\\name\n'})
    text = CodexHarness().config_files(odd, SCRATCH)[f"{SCRATCH}/codex-home/config.toml"]
    assert tomllib.loads(text)["model"] == 'we"ird\\name\n'


def test_opencode_command_env_and_config(run: HarnessRun) -> None:
    h = OpenCodeHarness(HarnessConfig(name="opencode", context_window=32768, max_output_tokens=2048))
    args = h.arguments(run)
    assert args[:3] == ["run", "--format", "json"] and "--pure" in args and "--auto" in args
    assert args[args.index("--title") + 1]  # a title: no title side request
    assert args[args.index("--model") + 1] == f"farm/{run.model}"
    env = h.environment(run, SCRATCH)
    assert env["OPENCODE_CONFIG"] == f"{SCRATCH}/opencode/opencode.json"
    assert env[OPENCODE_KEY] == "s3cret-key"
    assert {k: env[k] for k in OFFLINE_ENV} == OFFLINE_ENV
    assert env["OPENCODE_DISABLE_PROJECT_CONFIG"] == "1" and env["npm_config_offline"] == "true"
    files = h.config_files(run, SCRATCH)
    cfg = json.loads(files[f"{SCRATCH}/opencode/opencode.json"])
    provider = cfg["provider"]["farm"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": "http://127.0.0.1:8123/v1", "apiKey": "{env:FARM_GATEWAY_KEY}"}
    assert provider["models"][run.model]["limit"] == {"context": 32768, "output": 2048}
    assert cfg["model"] == cfg["small_model"] == f"farm/{run.model}"
    assert cfg["permission"]["webfetch"] == cfg["permission"]["websearch"] == "deny"
    assert cfg["tools"] == {"webfetch": False, "websearch": False}
    assert cfg["snapshot"] is False
    assert "s3cret-key" not in files[f"{SCRATCH}/opencode/opencode.json"]
    # Not named opencode.json in a parent of the workdir (OpenCode walks up looking for it).
    assert not run.workdir.startswith(str(Path(env["OPENCODE_CONFIG"]).parent))


def test_extra_args_env_and_files_outside_workdir(run: HarnessRun) -> None:
    """configure() composes argv/env this way (unit-level check of the order of precedence)."""
    cfg = HarnessConfig(name="claude_code", extra_args=["--max-turns", "7"], extra_env={"IS_SANDBOX": "0", "X": "1"})
    h = make_harness(cfg)
    env = {"HOME": f"{SCRATCH}/home", **run.env, **h.environment(run, SCRATCH), **cfg.extra_env}
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123"  # the task env cannot re-point the CLI
    assert env["PATH"] == "/venv/bin:/usr/bin:/bin"
    assert env["IS_SANDBOX"] == "0" and env["X"] == "1"  # extra_env wins
    assert diff_excludes([f"{SCRATCH}/instruction.txt", "/sb/root/repo/.farm.json", "/sb/root/repository/x"], run.workdir) == [
        ".farm.json"
    ]


def test_claude_code_stream() -> None:
    h = ClaudeCodeHarness()
    ok = events_of("claude-stream-json.jsonl")
    assert h.stream_error(ok) is None
    assert h.final_message(ok) == "Done: I created out.txt containing hello."
    assert h.retry_loop(ok) is None
    tool_error = events_of("claude-stream-json-error-tool.jsonl")  # a failing tool is not a failing run
    assert h.stream_error(tool_error) is None
    retrying = events_of("claude-api-retry-401.jsonl")
    assert h.stream_error(retrying) is None
    why = h.retry_loop(retrying)
    assert why is not None and "HTTP 401" in why and "authentication_failed" in why
    assert ClaudeCodeHarness(HarnessConfig(max_client_retries=99)).retry_loop(retrying) is None
    failed = [*ok[:-1], {**ok[-1], "is_error": True, "subtype": "error_during_execution", "result": "API Error: 500"}]
    assert h.stream_error(failed) == "error_during_execution: API Error: 500"


def test_codex_stream() -> None:
    h = CodexHarness()
    ok = events_of("codex-json.jsonl")
    assert h.stream_error(ok) is None
    assert h.final_message(ok) == "Done: I created out.txt containing hello."
    failed = events_of("codex-401-turn-failed.jsonl")
    assert "401 Unauthorized" in (h.stream_error(failed) or "")
    assert h.retry_loop(failed) is None  # it gave up: no longer retrying
    waiting = events_of("codex-reconnecting.jsonl")
    assert h.stream_error(waiting) is None
    why = h.retry_loop(waiting)
    assert why is not None and "Reconnecting" in why
    # warnings printed as error *items* do not fail a run
    assert any(e.get("item", {}).get("type") == "error" for e in ok + failed)


def test_opencode_stream() -> None:
    h = OpenCodeHarness()
    ok = events_of("opencode-json.jsonl")
    assert h.stream_error(ok) is None
    assert h.final_message(ok) == "Done: I created out.txt containing hello."
    failed = events_of("opencode-401-error.jsonl")
    assert h.stream_error(failed) == "APIError: unknown session secret"
    assert h.final_message(failed) is None


def test_parse_json_lines_tolerates_noise() -> None:
    text = '{"type":"a"}\nWARNING: x\n\n[1,2]\n{"type":"b"}\n{"type":"trunc'
    events, other = parse_json_lines(text)
    assert events == [{"type": "a"}, {"type": "b"}]
    assert other == 3
    # what the fast parser refuses the standard one still reads, as before
    events, other = parse_json_lines('{"x": NaN, "n": 123456789012345678901234567890}\n{"y": 1e400}')
    assert events[0]["n"] == 123456789012345678901234567890 and events[0]["x"] != events[0]["x"]
    assert events[1]["y"] == float("inf") and other == 0
    assert tail("abcdef", 3) == "def" and tail("abc", 0) == ""
    assert last_line("one\ntwo\n\n") == "two"


def test_probe_script_shapes() -> None:
    s = probe_script("http://10.0.0.5:8123", 3)
    assert "curl" not in s and "/dev/tcp/10.0.0.5/8123" in s  # bash alone: no curl start
    # a write into a reset connection fails with a message rather than killing bash (exit 141, no
    # reason): the "resets" case below hits it only when the reset outruns bash's writes
    assert "trap " in s and " PIPE; printf" in s
    s = probe_script("https://gw.example.com/", 3)
    assert "curl" in s and "https://gw.example.com/" in s and "/dev/tcp" not in s


@pytest.mark.parametrize(
    ("server", "code", "says"),
    [("http", 0, ""), ("refused", 7, "cannot connect to"), ("closes", 8, "no HTTP answer from"),
     ("silent", 124, "within 1 s"), ("not_http", 9, "not an HTTP answer from 127.0.0.1"),
     ("resets", 8, "no HTTP answer from")],
)  # fmt: skip
def test_the_http_probe_needs_an_http_answer(server: str, code: int, says: str) -> None:
    """A connect is not an answer (the jail's relay accepts even when the gateway behind it
    is gone, then closes): only an HTTP status line within the timeout is."""
    import socket
    import subprocess
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    if server != "refused":
        listener.listen()

        def serve() -> None:
            conn, _ = listener.accept()
            with conn:
                if server == "closes":
                    return
                if server == "resets":  # closed with the request half read: a reset, then EPIPE
                    conn.recv(5)
                    return
                request = b""
                while b"\r\n\r\n" not in request:  # bash writes it a line at a time
                    chunk = conn.recv(1024)
                    if not chunk:
                        return
                    request += chunk
                if server == "silent":
                    conn.recv(1024)  # until the probe gives up
                else:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\n\r\n" if server == "http" else b"SSH-2.0-x\r\n")

        threading.Thread(target=serve, daemon=True).start()
    try:
        res = subprocess.run(["bash", "-c", probe_script(f"http://127.0.0.1:{port}", 1)], capture_output=True,
                             text=True, timeout=30)  # fmt: skip
    finally:
        listener.close()
    assert res.returncode == code, res
    assert says in (res.stderr.strip().splitlines() or [""])[-1]
