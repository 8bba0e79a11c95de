"""`farm report` / `farm view` on a real output directory (see conftest.py)."""

from __future__ import annotations

import json
import re

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from report_helpers import DIFF, INSTRUCTION, TASK, write_rollouts
from farm.cli import main
from farm.report.html import render_report
from farm.report.server import PAGE, make_app
from farm.output.reader import open_sample_reader


def blobs(html: str) -> dict[str, object]:
    """Every JSON blob of the page, parsed as the browser parses it."""
    return {m[1]: json.loads(m[2]) for m in re.finditer(r'<script type="application/json" id="([^"]+)">(.*?)</script>', html, re.S)}


def test_report_holds_every_rollout_and_its_trajectory(real_run):
    html = render_report(real_run)
    data = blobs(html)
    rows = data["rows"]
    assert [r["rollout_id"] for r in rows] == [f"{TASK}.{i}" for i in range(3)]
    # summary over policy outcomes: the sandbox_error is counted but not in the resolved rate
    assert ">1 / 2<" in html and ">50.0%<" in html and ">status sandbox_error<" in html
    assert "<svg" in html and "mean reward by task" in html
    # the grading's flags: on every row, counted on the first page, each a filter
    assert [r["flags"] for r in rows] == [[], ["diff_touches_tests", "static:sys_modules"], []]
    assert ">1 / 3<" in html and "flagged rollouts (grading flags)" in html
    flags = html[html.index('<section id="flags">'):html.index("</section>", html.index('<section id="flags">'))]
    assert re.findall(r'data-flag="([^"]+)">[^<]*<b>(\d+)</b>', flags) == [
        ("*", "1"), ("diff_touches_tests", "1"), ("static:sys_modules", "1")]
    assert '<option value="static:sys_modules">static:sys_modules (1)</option>' in html
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', html)  # nothing fetched at view time
    d = data["r0"]
    assert d["diff"] == DIFF  # whole, "</script>" included
    assert d["tests"]["fail_to_pass"] == {"tests/test_calc.py::test_divide": "PASSED"}
    assert d["timings"] == {"create": 0.4, "agent": 3.5, "grade": 1.25}
    [view] = d["samples"]
    [sample] = [s for s in open_sample_reader(real_run).read_table().to_pylist() if s["rollout_id"] == f"{TASK}.0"]
    outputs = [s for s in view["segments"] if s["kind"] == "output"]
    assert len(outputs) == 3  # one trained run per model turn
    tokens = [t for s in outputs for t in s["tokens"]]
    mask = np.array(sample["loss_mask"])
    # every trained token is shown once, with the Sample's own logprob
    assert len(tokens) == view["trained"] == int(mask.sum())
    assert [lp for _, lp in tokens] == [round(x, 3) for x in np.array(sample["rollout_logprobs"])[mask == 1].tolist()]
    first = "".join(t for t, _ in outputs[0]["tokens"])
    assert "Let me look around." in first and '"git status"' in first and "<tool_call>" in first
    context = "".join(s["text"] for s in view["segments"] if s["kind"] == "context")
    assert "tool output 0.1: 1 failed" in context and "git status" not in context
    assert view["drift"]["appended"] == 2
    assert data["r2"]["samples"] == [] and data["r1"]["tests"]["fail_to_pass"]["tests/test_calc.py::test_divide"] == "FAILED"
    # per-rollout artifacts: the files listed (linked), an infrastructure failure's traceback embedded
    assert {f["name"] for f in d["artifacts"]["files"]} == {"agent.stdout.gz", "turns.jsonl.gz", "diff.patch.gz",
                                                            "task.json.gz"}  # fmt: skip
    assert d["artifacts"]["error"] is None and d["artifacts"]["dir"] == f"{TASK}.0"
    error = data["r2"]["artifacts"]["error"]
    assert "Traceback (most recent call last)" in error and "disk full" in error
    assert data["head"]["artifacts_base"] == ""  # the default page lives in the output directory


def test_report_command(real_run, tmp_path, capsys):
    dest = tmp_path / "r.html"
    assert main(["report", str(real_run), "-o", str(dest)]) == 0
    assert f"{TASK}.0" in dest.read_text() and "wrote" in capsys.readouterr().out
    assert blobs(dest.read_text())["head"]["artifacts_base"] == f"../{real_run.name}/"  # links reach the run
    assert main(["report", str(tmp_path / "nope")]) == 2
    (tmp_path / "bare").mkdir()
    assert main(["report", str(tmp_path / "bare")]) == 1  # no run_config.yaml, no --tokenizer
    assert "--tokenizer" in capsys.readouterr().err


async def test_view_renders_again_when_the_run_grows(tmp_path, tokenizer_dir, hf_tokenizer):
    """A run in progress: the page shows what the manifests list, and a reload after more
    rollouts became durable shows them (an unchanged run is not rendered again)."""
    (tmp_path / "run_config.yaml").write_text(f"engine: {{tokenizer: {tokenizer_dir}}}\n")
    await write_rollouts(tmp_path, hf_tokenizer, [("a__t.0", "completed", 1.0, None)])
    app = make_app(tmp_path)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        first = await (await client.get("/")).text()
        assert [r["rollout_id"] for r in blobs(first)["rows"]] == ["a__t.0"]
        await (await client.get("/")).text()
        assert app[PAGE].renders == 1
        await write_rollouts(tmp_path, hf_tokenizer, [("b__t.0", "timeout", 0.0, None)])
        again = blobs(await (await client.get("/")).text())
        assert [r["rollout_id"] for r in again["rows"]] == ["a__t.0", "b__t.0"] and app[PAGE].renders == 2
        assert again["r1"]["samples"][0]["trained"] > 0
        assert again["head"]["served"]  # the page links each artifact by its own name, served decompressed
        for name in ("agent.stdout", "agent.stdout.gz"):
            res = await client.get(f"/artifacts/b__t.0/{name}")
            assert res.status == 200 and '{"type":"result","subtype":"success"}' in await res.text()
            assert res.content_type == "text/plain" and res.charset == "utf-8"
            assert res.headers["Content-Disposition"] == 'inline; filename="agent.stdout"'  # shown, not downloaded
        res = await client.get("/artifacts/b__t.0/task.json")
        assert res.content_type == "application/json" and (await res.json())["id"] == "b__t"
        res = await client.get("/artifacts/b__t.0/diff.patch")
        assert res.content_type == "text/plain" and (await res.text()).startswith("diff --git")
        assert (await client.get("/artifacts/b__t.0/nope.gz")).status == 404
        assert (await client.get("/artifacts/b__t.0/nope")).status == 404
        assert (await client.get("/artifacts/../run_config.yaml")).status == 404


def test_report_answers_what_the_task_was(real_run):
    data = blobs(render_report(real_run))
    ref = data["r0"]["task"]
    assert ref is not None and data["r1"]["task"] == ref  # one blob per task, shared by its rollouts
    task = data[f"t{ref}"]
    assert task["instruction"] == INSTRUCTION and task["source"] == "acme/calc @ 0ff1ce"
    assert task["tests"] == "1 FAIL_TO_PASS, 1 PASS_TO_PASS" and "task.json" in task["origin"]


def test_report_wall_time_throughput_and_group_spread(tmp_path, real_run, tokenizer_dir, hf_tokenizer):
    from farm.output.busy import BusyTime
    from farm.report.stats import group_spread, throughput

    busy = BusyTime.of([(100, 101), (1, 10), (5, 12), (11, 11.5), (20, 30), (12, 20)])  # any order
    assert (busy.seconds, busy.span, len(busy)) == (29 + 1, 100, 2)  # overlaps once, the gap not at all
    rows = [{"started_at": 1000.0, "finished_at": 1060.0, "turns": 6, "output_tokens": 600},
            {"started_at": 1030.0, "finished_at": 1120.0, "turns": 3, "output_tokens": 300},
            {"started_at": 0.0, "finished_at": 0.0, "turns": 9, "output_tokens": 900}]  # rebuilt row: no times
    assert throughput(rows) == {"timed_rollouts": 2, "busy_s": 120.0, "span_s": 120.0,
                                "rollouts_per_min": 1.0, "turns_per_s": 0.075, "output_tokens_per_s": 7.5}
    # one definition: the run's own summary (what `farm run` prints) counts the same time and rates
    from farm.output.rows import RolloutSummary
    from farm.run.summary import SummaryTally

    run = SummaryTally.of(RolloutSummary(rollout_id=f"t.{i}", group_id="t", task_id="t", status="completed",
                                         started_at=r["started_at"], finished_at=r["finished_at"],
                                         output_tokens=r["output_tokens"]) for i, r in enumerate(rows[:2]))
    summ = run.summary("r", planned=2, wall_s=300.0)
    assert (summ.busy_s, summ.rollouts_per_min, summ.output_tokens_per_s) == (120.0, 1.0, 7.5)
    html = render_report(real_run)
    assert ">1 / 1<" in html and "groups with reward spread (GRPO signal)" in html and ">90<" in html
    [g] = group_spread(blobs(html)["rows"])  # over policy outcomes: the sandbox_error is excluded
    assert g == {"group_id": TASK, "n": 2, "excluded": 1, "mean": 0.5, "std": 0.5, "min": 0.0, "max": 1.0,
                 "flat": False}  # fmt: skip
    (tmp_path / "run_config.yaml").write_text(f"engine: {{tokenizer: {tokenizer_dir}}}\n")
    import asyncio

    asyncio.run(write_rollouts(tmp_path, hf_tokenizer, [("a__t.0", "completed", 1.0, None),
                                                        ("a__t.1", "completed", 1.0, None),
                                                        ("b__t.0", "completed", 0.0, None),
                                                        ("b__t.1", "completed", 1.0, None)]))  # fmt: skip
    with open(tmp_path / "invocations.jsonl", "w") as fh:  # the commands that wrote it: start-up to exit
        fh.write('{"command": "run", "started_at": 100.0, "ended_at": 190.0}\n')
        fh.write('{"command": "run", "started_at": 5000.0, "ended_at": 5030.5}\n{"command": "ru')  # cut by a crash
    html = render_report(tmp_path)
    cards = {k: v for v, k in re.findall(r'<div class="cv">([^<]*)</div><div class="ck">([^<]*)</div>', html)}
    assert cards["wall time (start-up to exit, 2 commands)"] == "2m 00s"
    assert {"busy time (rollouts running)", "first start to last end", "rollouts / min (over busy time)"} <= set(cards)
    groups = html[html.index('id="groups"'):]
    assert "1 of 2 groups have all rewards equal" in groups
    flat = re.findall(r'<tr class="flat"><td>([^<]+)</td>.*?</tr>', groups)
    assert flat == ["a__t"] and "all equal: no signal" in groups and ">1 / 2<" in html


async def test_report_fidelity_is_a_table_with_its_differences_decoded(tmp_path, tokenizer_dir, hf_tokenizer):
    """A Sample whose context differs from a fresh render (the template drops the earlier
    reasoning): a table of counts and the differing text, as the engine saw it and re-rendered."""
    from farm_helpers import make_result, reducer_config

    from farm.actors.reducer import ReducerActor
    from farm.gateway.fidelity import measure_session
    from farm.gateway.render import PromptRenderer
    from farm.trajectory.tree import TurnTree

    r = PromptRenderer(hf_tokenizer)
    h0 = [{"role": "user", "content": "fix it"}]
    response = {"role": "assistant", "content": "On it.", "reasoning_content": "Look first."}
    out_ids = r.encode("<think>\nLook first.\n</think>\n\nOn it.<|im_end|>")
    tree = TurnTree("s")
    t1 = tree.append(parent_id=None, prompt_delta_ids=r.full_prompt(h0, []), output_ids=out_ids,
                     output_logprobs=[-0.1] * len(out_ids), finish_reason="stop", messages=h0, response=response)
    new = [{"role": "user", "content": "go on"}]
    tree.append(parent_id=t1.turn_id, prompt_delta_ids=r.delta_ids(response, new, generated_end="<|im_end|>"),
                output_ids=r.encode("done"), output_logprobs=[-0.2], finish_reason="stop", messages=new)  # fmt: skip
    assert measure_session(tree, r, {"": []}, "ends") == 1
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(make_result("f.0", turns=0).model_copy(update={"tree": tree}))
    await red.close()
    (tmp_path / "run_config.yaml").write_text(f"engine: {{tokenizer: {tokenizer_dir}}}\n")
    html = render_report(tmp_path)
    fid = blobs(html)["r0"]["samples"][0]["fidelity"]
    table = dict(fid["rows"])
    assert table["tokens that differ"] > 0 and table["  in model outputs (as the model wrote them vs re-rendered)"] > 0
    assert any("Look first." in run["seen"] and "Look first." not in run["fresh"] for run in fid["runs"])
    overview = html[html.index('id="fidelity"'):]
    assert "<td>Samples with a difference</td><td class=\"num\">1</td>" in overview
    assert "{&quot;" not in overview and '{"seen_tokens"' not in html  # no raw JSON shown
