"""Policies: the oracle works a task through with each CLI's real tool vocabulary; noop,
replay (recorded by a worker), and prompt parsing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from simulator_helpers import chat_tools
from farm.simulator import PolicyRequest, make_policy
from farm.simulator.oracle import OraclePolicy, find_shell_tool
from farm.simulator.prompt import parse_chatml
from farm.simulator.protocol import SamplingParams
from farm.simulator.tasks import load_tasks_jsonl, write_tasks_jsonl
from farm.errors import TaskLoadError
from farm.modeltext.toolcalls import get_format
from farm.tasks.model import GitSource, Task

INSTRUCTION = "The add() function in calc.py subtracts instead of adding. Make it add its two arguments."
SHELL = {"claude_code": ("Bash", "command"), "codex": ("exec_command", "cmd"), "opencode": ("bash", "command")}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo_and_task(tmp_path: Path) -> tuple[Path, Task]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    patch = git(repo, "diff")
    git(repo, "checkout", "-q", "calc.py")
    task = Task(id="calc-1", instruction=INSTRUCTION, workspace=GitSource(url=str(repo), base_commit=base),
                gold_patch=patch, test_command="python -c 'import calc; assert calc.add(2, 3) == 5; print(\"1 passed\")'")
    return repo, task


def render(tok, messages, tools) -> list[int]:
    return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def ask(policy, tok, ids) -> str:
    req = PolicyRequest(rid="r", input_ids=ids, sampling=SamplingParams(), decode=lambda i: tok.decode(list(i)))
    return policy.respond(req).text


def run_tool(call, repo: Path) -> str:
    cmd = call.arguments.get("command", call.arguments.get("cmd"))
    res = subprocess.run(["bash", "-c", cmd], cwd=repo, capture_output=True, text=True, timeout=60)
    return res.stdout + res.stderr


@pytest.mark.parametrize("harness", ["claude_code", "codex", "opencode"])
def test_oracle_solves_task_with_each_cli_vocabulary(harness, repo_and_task, hf_tokenizer):
    repo, task = repo_and_task
    policy = OraclePolicy([task], seed=0, tool_format="hermes")
    parser = get_format("hermes")
    tools = chat_tools(harness)
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": f"<system-reminder>be brief</system-reminder>\n{INSTRUCTION}"}]
    name, arg = SHELL[harness]
    seen_calls = []
    for turn in range(6):
        text = ask(policy, hf_tokenizer, render(hf_tokenizer, messages, tools))
        parsed = parser.parse(text, tools=tools)
        assert not parsed.errors and parsed.reasoning
        if not parsed.tool_calls:
            break
        assert all(c.name == name and isinstance(c.arguments[arg], str) for c in parsed.tool_calls)
        seen_calls.append(parsed.tool_calls)
        calls = [{"id": f"c{turn}{i}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                 for i, c in enumerate(parsed.tool_calls)]
        messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
        for c, call in zip(parsed.tool_calls, calls):
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": run_tool(c, repo)})
    assert turn == 3, "look, apply, test, then a final answer"
    assert len(seen_calls[0]) == 2  # parallel calls on the first turn
    assert "return a + b" in (repo / "calc.py").read_text()  # the gold patch really applied
    assert "1 passed" in parsed.content  # the summary quotes the test output
    if harness == "claude_code":
        assert seen_calls[0][0].arguments["description"]


def test_oracle_reads_first_when_asked(repo_and_task, hf_tokenizer):
    """``reads``: that many more turns, each one reading call (the patched file, the log, a
    search, in turn) between the look and the fix; the fix and the test as before."""
    repo, task = repo_and_task
    policy = make_policy("oracle", oracle_reads=3, tasks_path=write_tasks_jsonl([task], repo.parent / "t.jsonl"))
    parser, tools = get_format("hermes"), chat_tools("codex")
    messages = [{"role": "user", "content": INSTRUCTION}]
    commands = []
    for turn in range(10):
        parsed = parser.parse(ask(policy, hf_tokenizer, render(hf_tokenizer, messages, tools)), tools=tools)
        if not parsed.tool_calls:
            break
        commands.append([c.arguments["cmd"] for c in parsed.tool_calls])
        calls = [{"id": f"c{turn}{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                 for i, c in enumerate(parsed.tool_calls)]  # fmt: skip
        messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": run_tool(c, repo)}
                     for c, call in zip(parsed.tool_calls, calls)]  # fmt: skip
    assert turn == 6, commands  # look, 3 reads, apply, test, then a final answer
    assert commands[1:4] == [["sed -n '1,80p' calc.py"], ["git log --oneline -10"], ["grep -rn 'def ' . | head -40"]]
    assert "return a + b" in (repo / "calc.py").read_text() and "1 passed" in parsed.content
    with pytest.raises(ValueError, match="reads must be >= 0"):
        OraclePolicy([task], reads=-1)


def test_oracle_qwen3_coder_format_and_thinking_prefix(repo_and_task, hf_tokenizer):
    _, task = repo_and_task
    policy = OraclePolicy([task], tool_format="qwen3_coder")
    tools = chat_tools("opencode")
    ids = render(hf_tokenizer, [{"role": "user", "content": INSTRUCTION}], tools)
    text = ask(policy, hf_tokenizer, ids)
    parsed = get_format("qwen3_coder").parse(text, tools=tools)
    assert [c.name for c in parsed.tool_calls] == ["bash", "bash"] and not parsed.errors
    # The template opened <think>: the output starts inside reasoning and closes it.
    ids_open = ids + hf_tokenizer.encode("<think>\n", add_special_tokens=False)
    text = ask(policy, hf_tokenizer, ids_open)
    assert not text.startswith("<think>") and "</think>" in text
    assert len(get_format("qwen3_coder").parse(text, in_reasoning=True, tools=tools).tool_calls) == 2
    # Thinking disabled: no think block at all.
    ids_off = hf_tokenizer.apply_chat_template([{"role": "user", "content": INSTRUCTION}], tools=tools,
                                               add_generation_prompt=True, tokenize=True, return_dict=False,
                                               enable_thinking=False)
    assert "<think>" not in ask(policy, hf_tokenizer, ids_off)


def test_oracle_unknown_task_or_no_shell_answers_politely(repo_and_task, hf_tokenizer):
    _, task = repo_and_task
    policy = OraclePolicy([task])
    for messages, tools in (([{"role": "user", "content": "Write me a poem."}], chat_tools("codex")),
                            ([{"role": "user", "content": INSTRUCTION}], None)):
        text = ask(policy, hf_tokenizer, render(hf_tokenizer, messages, tools))
        parsed = get_format("hermes").parse(text)
        assert not parsed.tool_calls and "sorry" in parsed.content.lower()


def test_noop_does_nothing(hf_tokenizer):
    policy = make_policy("noop", seed=3)
    text = ask(policy, hf_tokenizer, render(hf_tokenizer, [{"role": "user", "content": INSTRUCTION}],
                                            chat_tools("claude_code")))
    parsed = get_format("hermes").parse(text)
    assert not parsed.tool_calls and parsed.content


@pytest.mark.parametrize("harness", ["claude_code", "codex", "opencode"])
def test_loop_never_stops_and_ramble_never_ends_its_turn(harness, hf_tokenizer):
    """Only a budget ends them (farm.simulator.endless): loop calls the CLI's shell
    tool on every turn, however many came before; ramble writes no EOS."""
    name, arg = SHELL[harness]
    loop, parser, tools = make_policy("loop"), get_format("hermes"), chat_tools(harness)
    messages = [{"role": "user", "content": INSTRUCTION}]
    for turn in range(6):
        parsed = parser.parse(ask(loop, hf_tokenizer, render(hf_tokenizer, messages, tools)), tools=tools)
        (call,) = parsed.tool_calls
        assert call.name == name and isinstance(call.arguments[arg], str) and not parsed.errors
        messages += [{"role": "assistant", "content": "", "tool_calls": [
                         {"id": f"c{turn}", "type": "function", "function": {"name": name, "arguments": call.arguments}}]},
                     {"role": "tool", "tool_call_id": f"c{turn}", "content": "a.py"}]  # fmt: skip
    title = render(hf_tokenizer, [{"role": "user", "content": "Title for: fix calc"}], None)
    assert not parser.parse(ask(loop, hf_tokenizer, title)).tool_calls  # a side request gets plain text
    req = PolicyRequest(rid="r", input_ids=render(hf_tokenizer, messages, tools), sampling=SamplingParams(),
                        decode=lambda i: hf_tokenizer.decode(list(i)))  # fmt: skip
    assert make_policy("ramble").respond(req).eos is False


def test_prompt_parsing_finds_shell_tools(hf_tokenizer):
    for harness, (name, arg) in SHELL.items():
        prompt = hf_tokenizer.decode(render(hf_tokenizer, [{"role": "user", "content": "hi"}], chat_tools(harness)))
        parsed = parse_chatml(prompt)
        assert [m.role for m in parsed.messages] == ["system", "user"]
        shell = find_shell_tool(parsed.tools)
        assert shell is not None and (shell.name, shell.arg) == (name, arg)
    assert len(parse_chatml(hf_tokenizer.decode(render(hf_tokenizer, [{"role": "user", "content": "x"}],
                                                       chat_tools("claude_code")))).tools) == 24


async def test_record_then_replay_reproduces_outputs(repo_and_task, make_worker, http, hf_tokenizer, tmp_path):
    _, task = repo_and_task
    rec = tmp_path / "rec.jsonl"
    _, url = await make_worker(OraclePolicy([task]), record_path=str(rec))
    prompts = [render(hf_tokenizer, [{"role": "user", "content": INSTRUCTION}], chat_tools(h))
               for h in ("claude_code", "codex")]
    originals = []
    for i, ids in enumerate(prompts):
        async with http.post(url + "/generate", json={"input_ids": ids},
                             headers={"X-SMG-Routing-Key": f"s{i}"}) as r:
            originals.append((await r.json())["output_ids"])
    lines = [json.loads(line) for line in rec.read_text().splitlines()]
    assert [e["routing_key"] for e in lines] == ["s0", "s1"] and lines[0]["turn"] == 0
    replay = make_policy("replay", replay_path=rec)
    _, url2 = await make_worker(replay)
    for ids, want in zip(prompts, originals):
        async with http.post(url2 + "/generate", json={"input_ids": ids}) as r:
            assert (await r.json())["output_ids"] == want
    async with http.post(url2 + "/generate", json={"input_ids": [5, 6, 7]}) as r:
        assert "no recorded output" in (await r.json())["text"]
    assert replay.misses == 1


def test_tasks_jsonl_roundtrip_and_errors(repo_and_task, tmp_path):
    _, task = repo_and_task
    path = write_tasks_jsonl([task], tmp_path / "tasks.jsonl")
    assert load_tasks_jsonl(path) == [task]
    path.write_text(path.read_text() + '{"id": "x"}\n')
    with pytest.raises(TaskLoadError) as err:
        load_tasks_jsonl(path)
    assert err.value.line == 2 and "instruction" in err.value.field


@pytest.mark.parametrize("harness", ["claude_code", "codex", "opencode"])
def test_shell_policy_plays_its_script_per_task(harness, repo_and_task, hf_tokenizer, tmp_path):
    repo, task = repo_and_task
    tasks_path = write_tasks_jsonl([task], tmp_path / "tasks.jsonl")
    script = tmp_path / "script.jsonl"
    script.write_text(json.dumps({"task_id": task.id, "turns": [["echo one > a.txt", "echo two > b.txt"],
                                                                 ["cat a.txt b.txt"]]}) + "\n"
                      + json.dumps({"task_id": "*", "turns": [["echo other"]]}) + "\n")
    policy = make_policy("shell", tool_format="hermes", tasks_path=tasks_path, replies_path=script)
    parser, tools, (name, arg) = get_format("hermes"), chat_tools(harness), SHELL[harness]
    messages = [{"role": "user", "content": INSTRUCTION}]
    played = []
    for turn in range(4):
        parsed = parser.parse(ask(policy, hf_tokenizer, render(hf_tokenizer, messages, tools)), tools=tools)
        if not parsed.tool_calls:
            break
        assert all(c.name == name for c in parsed.tool_calls)
        played.append([c.arguments[arg] for c in parsed.tool_calls])
        calls = [{"id": f"c{turn}{i}", "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                 for i, c in enumerate(parsed.tool_calls)]
        messages.append({"role": "assistant", "content": parsed.content, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": run_tool(c, repo)}
                     for c, call in zip(parsed.tool_calls, calls)]
    assert played == [["echo one > a.txt", "echo two > b.txt"], ["cat a.txt b.txt"]]
    assert "one\ntwo" in messages[-1]["content"]
    # Another task gets the "*" entry.
    other = [{"role": "user", "content": "Something else entirely."}]
    parsed = parser.parse(ask(policy, hf_tokenizer, render(hf_tokenizer, other, tools)), tools=tools)
    assert [c.arguments[arg] for c in parsed.tool_calls] == ["echo other"]


def test_shell_policy_script_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x", "turns": [[]]}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        make_policy("shell", replies_path=bad)
    with pytest.raises(ValueError, match="needs a script"):
        make_policy("shell")


@pytest.mark.parametrize("harness", ["claude_code", "codex", "opencode"])
def test_choose_policy_applies_the_candidate_the_model_picks(harness, repo_and_task, hf_tokenizer):
    """The choice family: K candidate patches per task, the gold one where ``right`` says;
    each option's continuation applies its own candidate with the CLI's shell tool, and
    only the gold one fixes the repo (a decoy applies cleanly and changes no behaviour)."""
    from farm.simulator.choose import ChoosePolicy
    from farm.simulator.policy import PolicyRequest
    from farm.simulator.choice_tasks import choice_tasks

    repo, task = repo_and_task
    (choice,) = choice_tasks([task], k=3, right=1)
    assert choice.metadata["right_candidate"] == "B" and "[A], [B], [C]" in choice.instruction
    policy = make_policy("choose", tasks_path=write_tasks_jsonl([choice], repo.parent / "tasks.jsonl"))
    assert isinstance(policy, ChoosePolicy)
    tools = chat_tools(harness)
    name, arg = SHELL[harness]
    messages = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": choice.instruction}]
    ids = render(hf_tokenizer, messages, tools)
    reply = policy.respond(PolicyRequest(rid="r", input_ids=ids, sampling=SamplingParams(),
                                         decode=lambda i: hf_tokenizer.decode(list(i))))
    assert reply.text.endswith("I apply candidate [") and [t for t, _ in reply.choice.options] == ["A", "B", "C"]
    assert all(len(hf_tokenizer.encode(t, add_special_tokens=False)) == 1 for t, _ in reply.choice.options)
    for label, continuation in reply.choice.options:
        git(repo, "checkout", "-q", ".")
        git(repo, "clean", "-fdq")
        parsed = get_format("hermes").parse(reply.text + label + continuation, tools=tools)
        (call,) = parsed.tool_calls
        assert call.name == name
        run_tool(call, repo)
        fixed = "return a + b" in (repo / "calc.py").read_text()
        assert fixed == (label == "B"), label
        assert git(repo, "status", "--porcelain").strip()  # every candidate changed the tree
    assert "not sure" in reply.choice.continuation("Z")  # any other token: no tool call, the agent stops
    # after the tool result: a summary, no tool call
    messages += [{"role": "assistant", "content": "I apply candidate [B].", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": name, "arguments": json.dumps({arg: "true"})}}]},
        {"role": "tool", "tool_call_id": "c0", "content": ""}]
    done = ask(policy, hf_tokenizer, render(hf_tokenizer, messages, tools))
    assert not get_format("hermes").parse(done, tools=tools).tool_calls
    with pytest.raises(ValueError, match="candidate_patches"):
        ChoosePolicy([task.model_copy(update={"metadata": {"candidate_patches": "not a list"}})])
