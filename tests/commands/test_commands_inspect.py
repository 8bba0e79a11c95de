"""`farm inspect`: summary + one Sample decoded with its trained spans marked."""

from __future__ import annotations

import numpy as np
import yaml

from farm.actors.reducer import ReducerActor
from farm.cli import main
from farm.commands.inspect import CLOSE, OPEN, trained_spans
from farm.trajectory.tree import TurnTree

from farm_helpers import make_result, reducer_config


def test_trained_spans():
    assert trained_spans(np.array([0, 0, 1, 1, 0, 1], np.uint8)) == [(0, 2, False), (2, 4, True), (4, 5, False), (5, 6, True)]
    assert trained_spans(np.zeros(0, np.uint8)) == []


async def test_inspect_decodes_trained_spans(tmp_path, tokenizer_dir, hf_tokenizer, capsys):
    enc = lambda s: hf_tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    tree = TurnTree("s")
    t1 = tree.append(parent_id=None, prompt_delta_ids=enc("fix the bug please"), output_ids=enc("I will look"),
                     output_logprobs=[-0.1] * len(enc("I will look")), finish_reason="stop")
    tree.append(parent_id=t1.turn_id, prompt_delta_ids=enc(" tool says ok "), output_ids=enc("done now"),
                output_logprobs=[-0.2] * len(enc("done now")), finish_reason="stop")
    result = make_result("t.0", turns=0).model_copy(update={"tree": tree})
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(result)
    await red.close()
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump({"engine": {"tokenizer": str(tokenizer_dir)}}))
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{OPEN}I will look{CLOSE}" in out and f"{OPEN}done now{CLOSE}" in out
    assert "tool says ok" in out and f"{OPEN} tool" not in out
    assert '"completed": 1' in out


async def test_inspect_fidelity_lists_the_worst_samples(tmp_path, tokenizer_dir, hf_tokenizer, capsys):
    from farm.gateway.fidelity import measure_session
    from farm.gateway.render import PromptRenderer

    r = PromptRenderer(hf_tokenizer)
    h0 = [{"role": "user", "content": "fix it"}]
    reply = "<think>\nLook first.\n</think>\n\nOn it.<|im_end|>"
    response = {"role": "assistant", "content": "On it.", "reasoning_content": "Look first."}
    tree = TurnTree("s")
    out_ids = r.encode(reply)
    t1 = tree.append(parent_id=None, prompt_delta_ids=r.full_prompt(h0, []), output_ids=out_ids,
                     output_logprobs=[-0.1] * len(out_ids), finish_reason="stop", messages=h0, response=response)
    new = [{"role": "user", "content": "go on"}]
    delta = r.delta_ids(response, new, generated_end="<|im_end|>")
    tree.append(parent_id=t1.turn_id, prompt_delta_ids=delta, output_ids=r.encode("done"), output_logprobs=[-0.2],
                finish_reason="stop", messages=new)  # fmt: skip
    assert measure_session(tree, r, {"": []}, "ends") == 1
    result = make_result("t.0", turns=0).model_copy(update={"tree": tree})
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(result)
    await red.close()
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump({"engine": {"tokenizer": str(tokenizer_dir)}}))
    assert main(["inspect", str(tmp_path), "--fidelity"]) == 0
    out = capsys.readouterr().out
    assert '"samples_measured": 1' in out and '"samples_with_differences": 1' in out
    assert "t.0 chain=0" in out and "model_output=" in out
    assert "engine saw:" in out and "Look first." in out


async def test_inspect_unknown_rollout_exits_nonzero(tmp_path, capsys):
    """A rollout id the run does not hold is an error, whatever else is asked for."""
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(make_result("t.0"))
    await red.close()
    for extra in ([], ["--no-sample"], ["--fidelity"]):
        assert main(["inspect", str(tmp_path), "--rollout", "nope", *extra]) == 1, extra
        err = capsys.readouterr().err
        assert "no rollout 'nope'" in err and "t.0" in err
    assert main(["inspect", str(tmp_path), "--rollout", "t.0", "--no-sample"]) == 0


async def test_inspect_lists_a_rollouts_artifacts(tmp_path, capsys):
    from farm.output.artifacts import build_artifacts

    result = make_result("t.0")
    result.artifacts = build_artifacts("t.0", {"agent.stdout": "x" * 10000, "diff.patch": "diff --git a/x b/x\n"},
                                       cap=8192, index={"attempt": 1, "status": "completed"})
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(result)
    await red.close()
    assert main(["inspect", str(tmp_path), "--rollout", "t.0", "--no-sample"]) == 0
    out = capsys.readouterr().out
    assert "artifacts" in out and "attempt 1, completed" in out
    assert "agent.stdout.gz" in out and "10,000 bytes" in out and "truncated: 10,000 ->" in out
    assert "diff.patch.gz" in out and "19 bytes" in out


async def _one_rollout(out, tokenizer, *, task=None, artifacts=True):
    """One rollout with a two-turn session through the ReducerActor (and its task.json)."""
    from farm.output.artifacts import build_artifacts

    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731
    tree = TurnTree("s")
    prompt = enc("system prompt " + "lorem ipsum dolor sit amet " * 400 + " fix the bug please")
    t1 = tree.append(parent_id=None, prompt_delta_ids=prompt, output_ids=enc("I will look"),
                     output_logprobs=[-0.1] * len(enc("I will look")), finish_reason="stop")
    tree.append(parent_id=t1.turn_id, prompt_delta_ids=enc(" tool says ok "), output_ids=enc("done now"),
                output_logprobs=[-0.2] * len(enc("done now")), finish_reason="stop")
    result = make_result("t.0", turns=0).model_copy(update={"tree": tree})
    if artifacts:
        result.artifacts = build_artifacts("t.0", {"task.json": task.model_dump_json()}, cap=1 << 20,
                                           index={"attempt": 1, "status": "completed"})
    red = ReducerActor(reducer_config(out), metrics=False)
    await red.submit(result)
    await red.close()


def _task(instruction: str):
    from farm.tasks.model import GitSource, Task

    return Task(id="t", instruction=instruction, workspace=GitSource(repo="acme/calc", base_commit="abc1234"),
                test_command="pytest -rA", fail_to_pass=["tests/test_calc.py::test_div"])


async def test_inspect_shows_the_task_and_cuts_with_a_marker(tmp_path, tokenizer_dir, hf_tokenizer, capsys):
    """What was the task: its id, repository @ commit and instruction, read from the
    rollout's artifacts; the decoded Sample cut to --max-chars with a marker (--full: whole);
    piped output is not wrapped at 80 columns."""
    long_line = "Division by zero in calc.divide() " + "when the divisor comes from user input " * 6
    await _one_rollout(tmp_path, hf_tokenizer, task=_task(long_line + "\nPlease fix it."))
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump({"engine": {"tokenizer": str(tokenizer_dir)}}))
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "task t (swe), from the rollout's artifacts (task.json)" in out
    assert "source: acme/calc @ abc1234" in out and "tests: 1 FAIL_TO_PASS, 0 PASS_TO_PASS" in out
    assert long_line in out.splitlines()  # whole: one line of 260 characters, not wrapped at 80
    marker = [ln for ln in out.splitlines() if ln.startswith("[... the first ")]
    assert len(marker) == 1 and "characters of the decoded Sample are cut: --full shows all" in marker[0]
    assert f"{OPEN}done now{CLOSE}" in out and "system prompt" not in out  # the tail is kept
    assert main(["inspect", str(tmp_path), "--full"]) == 0
    full = capsys.readouterr().out
    assert "system prompt" in full and "[... the first" not in full and f"{OPEN}I will look{CLOSE}" in full
    assert main(["inspect", str(tmp_path), "--max-chars", "40", "--rollout", "t.0"]) == 0
    cut = capsys.readouterr().out
    assert "[... the last " in cut and "characters of the instruction are cut" in cut and long_line[:40] in cut


async def test_inspect_finds_the_task_in_the_task_file_without_artifacts(tmp_path, tokenizer_dir, hf_tokenizer, capsys):
    """A run from before task.json (or with artifacts off): the task is looked up by id in
    the run's task file, and said so."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(_task("Make divide() raise ValueError on zero.").model_dump_json() + "\n")
    out_dir = tmp_path / "out"
    await _one_rollout(out_dir, hf_tokenizer, artifacts=False)
    (out_dir / "run_config.yaml").write_text(yaml.safe_dump({"engine": {"tokenizer": str(tokenizer_dir)},
                                                             "tasks": {"path": str(tasks)}}))  # fmt: skip
    assert main(["inspect", str(out_dir), "--rollout", "t.0", "--no-sample"]) == 0
    out = capsys.readouterr().out
    assert f"from the run's task file {tasks}" in out and "Make divide() raise ValueError on zero." in out
    tasks.unlink()
    assert main(["inspect", str(out_dir), "--rollout", "t.0", "--no-sample"]) == 0
    assert "task t: not recorded" in capsys.readouterr().out


async def test_inspect_counts_come_from_the_table_and_a_stale_summary_is_named(tmp_path, capsys):
    """summary.json written when the directory held 1 rollout, a second added since (as
    `farm rollout` into a run's directory would): inspect's counts are the table's, and it
    says the summary is stale."""
    import json

    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(make_result("t.0"))
    await red.close()
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": "r", "finished": 1, "cumulative": {"rollouts": 1}}))
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(make_result("u.0"))
    await red.close()
    assert main(["inspect", str(tmp_path), "--no-sample"]) == 0
    out = capsys.readouterr().out
    head = out[: out.index("last invocation")]
    assert '"rollouts": 2' in head and '"groups": 2' in head
    assert "note: summary.json was written when the directory held 1 rollouts; its rollouts table holds 2 now" in out
