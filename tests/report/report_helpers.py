"""Report tests' helpers: a real output directory's rollouts, written as `farm run` writes them.

The run's trees are recorded by the real gateway over the real scripted worker (tests/
gateway's kit: a Claude Code-style conversation with tool calls), linearized and
written by the in-process ReducerActor (Sample shards, manifests, rollouts table), as
`farm run` writes them. The helper modules of tests/gateway and tests/farm are put on
sys.path here (pytest puts only this directory there). A module of its own, not
conftest.py: `from conftest import` would find another directory's conftest when several
test directories are collected in one call.
"""

from __future__ import annotations

import sys
from pathlib import Path


TESTS = Path(__file__).resolve().parents[1]
for sub in ("gateway", "farm"):
    if str(TESTS / sub) not in sys.path:
        sys.path.insert(0, str(TESTS / sub))

TASK = "calc__fix-divide"
# "</script>" in a diff: the report must keep any text inside its JSON blobs
DIFF = "diff --git a/calc.py b/calc.py\n@@ -1 +1 @@\n-    return a / 0\n+    return a / b  # </script> safe\n"
GRADING_OK = {"resolved": True, "outcome": "resolved", "fail_to_pass": {"tests/test_calc.py::test_divide": "PASSED"},
              "pass_to_pass": {"tests/test_calc.py::test_add": "PASSED"}}  # fmt: skip
# a rollout whose diff went for the tests and tried a reward hack the grader found: flagged
GRADING_BAD = {"resolved": False, "outcome": "unresolved", "fail_to_pass": {"tests/test_calc.py::test_divide": "FAILED"},
               "pass_to_pass": {"tests/test_calc.py::test_add": "PASSED"},
               "flags": ["diff_touches_tests", "static:sys_modules"], "hack_action": "flag"}  # fmt: skip


async def record_session(tokenizer, sid: str, plan: list[tuple[str, list[tuple[str, dict]]]]):
    """A session through the real gateway: each (text, tool calls) is one model reply; the
    client echoes it with tool output like Claude Code does. Returns the turn tree."""
    from gateway_helpers import Conversation, check_stream, reply_text

    from gateway_helpers import gateway_env

    conv = Conversation("anthropic", "Fix the failing test in calc.py")
    async with gateway_env(tokenizer) as env:
        h = env.gw.open_session(sid)
        for i, (text, calls) in enumerate(plan):
            env.script(sid, reply_text(text, calls))
            body = conv.request()
            status, out, _ = await env.post("anthropic", body, h.secret)
            assert status == 200, out
            reply = check_stream("anthropic", out, body)
            conv.echo(reply, [f"tool output {i}.{j}: 1 failed" for j in range(len(conv.calls(reply)))])
        return await env.gw.close_session(sid)


PLAN = [("Let me look around.", [("Bash", {"command": "git status"}), ("Bash", {"command": "cat calc.py"})]),
        ("", [("Bash", {"command": "pytest -q tests/test_calc.py"})]),
        ("Fixed the division.", [])]  # fmt: skip


STREAM = '{"type":"system","subtype":"init"}\n{"type":"result","subtype":"success"}\n'
INSTRUCTION = "calc.divide(a, b) returns a / 0.\nMake it divide by b; tests/test_calc.py::test_divide shows the bug."


def task_json(task_id: str) -> str:
    """The task a rollout was given, as the pipeline keeps it in its artifacts (task.json)."""
    from farm.tasks.model import GitSource, Task

    return Task(id=task_id, instruction=INSTRUCTION, workspace=GitSource(repo="acme/calc", base_commit="0ff1ce"),
                test_command="python -m pytest -rA", fail_to_pass=["tests/test_calc.py::test_divide"],
                pass_to_pass=["tests/test_calc.py::test_add"]).model_dump_json()  # fmt: skip


def _traceback() -> str:
    import traceback

    from farm.errors import SandboxError

    try:
        raise SandboxError("bwrap: cannot create sandbox (disk full)")
    except SandboxError:
        return traceback.format_exc()


async def write_rollouts(out: Path, tokenizer, specs: list[tuple[str, str, float, dict | None]]) -> None:
    """Rollouts (id, status, reward, grading) through the ReducerActor; completed ones get a
    session recorded through the gateway, the others none (as an infrastructure failure)."""
    from farm_helpers import make_result, reducer_config

    from farm.actors.reducer import ReducerActor
    from farm.output.artifacts import build_artifacts, turns_jsonl
    from farm.output.rows import counts_of
    from farm.status import RolloutStatus

    red = ReducerActor(reducer_config(out), metrics=False)
    for rid, status, reward, grading in specs:
        st = RolloutStatus(status)
        tree = await record_session(tokenizer, rid, PLAN) if st.trainable else None
        result = make_result(rid, status=st, reward=reward, turns=0).model_copy(update={
            "tree": tree, "counts": counts_of(tree), "grading": grading, "diff": DIFF if tree else "",
            "timings": {"create": 0.4, "agent": 3.5, "grade": 1.25}, "task_id": rid.rsplit(".", 1)[0]})  # fmt: skip
        texts = {"agent.stdout": STREAM, "turns.jsonl": turns_jsonl(tree), "diff.patch": result.diff} if tree else \
            {"error.txt": f"status: {status}\nreason: because\n\n{_traceback()}"}
        texts["task.json"] = task_json(result.task_id)
        result.artifacts = build_artifacts(rid, texts, cap=1 << 20, index={"attempt": 1, "status": status})
        await red.submit(result)
    await red.close()
