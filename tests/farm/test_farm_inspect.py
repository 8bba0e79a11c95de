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
    from farm.rollout.artifacts import build_artifacts

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
