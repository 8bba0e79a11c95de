"""`farm report` / `farm view` on a real output directory (see conftest.py)."""

from __future__ import annotations

import json
import re

import numpy as np
from aiohttp.test_utils import TestClient, TestServer

from conftest import DIFF, TASK, write_rollouts
from farm.cli import main
from farm.report.html import render_report
from farm.report.server import PAGE, make_app
from farm.trajectory.output import open_sample_reader


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
    assert {f["name"] for f in d["artifacts"]["files"]} == {"agent.stdout.gz", "turns.jsonl.gz", "diff.patch.gz"}
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
        res = await client.get("/artifacts/b__t.0/agent.stdout.gz")  # the page's links: served unzipped
        assert res.status == 200 and '{"type":"result","subtype":"success"}' in await res.text()
        assert (await client.get("/artifacts/b__t.0/nope.gz")).status == 404
        assert (await client.get("/artifacts/../run_config.yaml")).status == 404
