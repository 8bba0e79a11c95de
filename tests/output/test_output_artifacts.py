"""Per-rollout artifacts (farm.output.artifacts): built by the pipeline (real local
sandboxes and processes), capped with the cut recorded, written by the reducer only for
the attempt it records, atomically. The real CLIs' artifacts are checked in
test_farm_e2e.py (the same run, no extra cost)."""

from __future__ import annotations

import gzip
import json
import subprocess

from farm import errors as E
from farm.actors.reducer import ReducerActor
from farm.output.artifacts import artifact_dir, build_artifacts, read_index, read_text, write_artifacts
from farm.output.config import ArtifactsConfig
from farm.rollout.model import RolloutSpec
from farm.rollout.pipeline import REDACTED, AgentEnd, Grade, RolloutPipeline
from farm.sandboxes.base import SandboxSpec
from farm.sandboxes.config import SandboxConfig
from farm.sandboxes.factory import create_sandbox
from farm.status import RolloutStatus as S
from farm.tasks.model import Task

from farm_helpers import make_result, reducer_config


def test_cap_cuts_the_largest_files_and_records_it(tmp_path):
    stream = "".join(json.dumps({"type": "event", "n": i}) + "\n" for i in range(20000))  # ~500 KB
    texts = {"agent.stdout": stream, "diff.patch": "diff --git a/x b/x\n+fixed\n", "error.txt": ""}
    arts = build_artifacts("t.0", texts, cap=64 << 10, index={"attempt": 1})
    files = {f["name"]: f for f in arts.index["files"]}
    assert set(files) == {"agent.stdout.gz", "diff.patch.gz"}  # empty texts leave no file
    assert arts.index["truncated"] is True and arts.index["max_bytes"] == 64 << 10
    out = files["agent.stdout.gz"]
    assert out["truncated"] and out["bytes"] == len(stream) and out["kept_bytes"] <= (64 << 10)
    assert sum(f["kept_bytes"] for f in files.values()) <= 64 << 10
    assert not files["diff.patch.gz"]["truncated"]  # the small file kept whole: the big one gave way
    kept = gzip.decompress(arts.files["agent.stdout.gz"]).decode().splitlines()
    parsed = [json.loads(line) for line in kept]  # cut at line ends: every line still parses
    assert parsed[0] == {"type": "event", "n": 0} and parsed[-1] == {"type": "event", "n": 19999}
    (marker,) = [p for p in parsed if "truncated_bytes" in p]
    assert marker["truncated_bytes"] == len(stream.encode()) - sum(len(x) + 1 for x in kept) + len(json.dumps(marker)) + 1
    write_artifacts(tmp_path, arts)
    assert read_index(tmp_path, "t.0")["files"] == arts.index["files"]
    assert read_text(tmp_path, "t.0", "diff.patch") == texts["diff.patch"]


def test_write_replaces_an_unrecorded_attempt_and_leaves_no_temp(tmp_path):
    write_artifacts(tmp_path, build_artifacts("t/1.0", {"agent.stdout": "first"}, cap=4096, index={"attempt": 1}))
    write_artifacts(tmp_path, build_artifacts("t/1.0", {"diff.patch": "second"}, cap=4096, index={"attempt": 2}))
    d = artifact_dir(tmp_path, "t/1.0")
    assert d.parent == tmp_path / "artifacts"  # one path component, whatever the id holds
    assert sorted(p.name for p in d.iterdir()) == ["diff.patch.gz", "index.json"]
    assert read_index(tmp_path, "t/1.0")["attempt"] == 2
    assert [p.name for p in (tmp_path / "artifacts").iterdir()] == [d.name]


class _Parts:
    """Real sandboxes and processes; the agent prints the session key; grading may crash."""

    def __init__(self, base, crash_grader=False, agent_extra=""):
        self.cfg = SandboxConfig.model_validate({"local": {"base_dir": str(base)}})
        self.crash_grader = crash_grader
        self.agent_extra = agent_extra

    async def create_sandbox(self, spec, purpose):
        return await create_sandbox(self.cfg, SandboxSpec(labels={"run_id": spec.run_id, "rollout_id": spec.rollout_id}))

    async def prepare(self, sb, spec):
        await sb.exec("mkdir -p repo && echo hi > repo/f", timeout=30)

    async def open_session(self, spec):
        return "sk-secret-" + spec.rollout_id

    async def run_agent(self, sb, spec, secret, budget_s, workspace):
        proc = await sb.start(f"echo '{{\"type\":\"start\",\"key\":\"{secret}\"}}'; echo change >> repo/f; "
                              f"echo warn >&2; {self.agent_extra}")
        res = await proc.wait(timeout=budget_s)
        return AgentEnd(exit_code=res.exit_code, stdout=res.stdout, stderr=res.stderr)

    async def capture(self, sb, spec, workspace):
        return (await sb.read_file(f"{sb.root}/repo/f")).decode()

    async def close_session(self, secret):
        return None

    async def grade(self, spec, diff):
        if self.crash_grader:
            raise E.GradingError("pytest missing from the image")
        return Grade(reward=1.0, report={"resolved": True}, test_log="1 passed\n")


async def test_infra_failure_keeps_error_and_traceback_and_only_the_recorded_attempt(tmp_path):
    task = Task(id="t", instruction="do it")
    red = ReducerActor(reducer_config(tmp_path / "out"), metrics=False)
    pipe = RolloutPipeline(_Parts(tmp_path, crash_grader=True), harness="claude_code", timeout_s=60,
                           artifacts=ArtifactsConfig())  # fmt: skip
    first = await pipe.run(RolloutSpec(run_id="a", rollout_id="t.0", group_id="t", sample_index=0, task=task))
    assert first.status is S.GRADING_ERROR and first.artifacts is not None
    # the sandbox actor retries an infrastructure failure without submitting it: nothing written
    assert not (tmp_path / "out" / "artifacts").exists()
    second = await pipe.run(RolloutSpec(run_id="a", rollout_id="t.0", group_id="t", sample_index=0, task=task, attempt=2))
    await red.submit(second)
    idx = read_index(tmp_path / "out", "t.0")
    assert idx["attempt"] == 2 and idx["status"] == "grading_error" and "grade" in idx["timings"]
    error = read_text(tmp_path / "out", "t.0", "error.txt")
    assert "pytest missing from the image" in error and "Traceback (most recent call last)" in error
    assert "GradingError" in error
    out = read_text(tmp_path / "out", "t.0", "agent.stdout")
    assert '"type":"start"' in out and "sk-secret" not in out and REDACTED in out  # the key never lands on disk
    assert read_text(tmp_path / "out", "t.0", "agent.stderr") == "warn\n"
    assert read_text(tmp_path / "out", "t.0", "diff.patch") == "hi\nchange\n"
    # a duplicate submit of a recorded rollout (a re-dispatch) writes nothing
    dup = make_result("t.0", status=S.COMPLETED)
    dup.artifacts = build_artifacts("t.0", {"diff.patch": "other"}, cap=4096, index={"attempt": 3})
    await red.submit(dup)
    assert read_index(tmp_path / "out", "t.0")["attempt"] == 2
    await red.close()


async def test_the_cap_holds_through_the_reducer_and_zcat_reads_the_files(tmp_path):
    """A chatty agent (~600 KB of events) under a 16 KiB cap: the recorded files keep the
    head and tail, index.json says what was cut, and plain zcat reads them."""
    task = Task(id="t", instruction="do it")
    chatty = "for i in $(seq 20000); do echo '{\"type\":\"assistant\",\"n\":'$i'}'; done"
    pipe = RolloutPipeline(_Parts(tmp_path, agent_extra=chatty), harness="codex", timeout_s=60,
                           artifacts=ArtifactsConfig(max_bytes_per_rollout=16 << 10))  # fmt: skip
    result = await pipe.run(RolloutSpec(run_id="a", rollout_id="t.0", group_id="t", sample_index=0, task=task))
    assert result.status is S.COMPLETED
    red = ReducerActor(reducer_config(tmp_path / "out"), metrics=False)
    await red.submit(result)
    await red.close()
    idx = read_index(tmp_path / "out", "t.0")
    files = {f["name"]: f for f in idx["files"]}
    assert idx["truncated"] is True and files["agent.stdout.gz"]["truncated"] and files["agent.stdout.gz"]["bytes"] > 500_000
    assert sum(f["kept_bytes"] for f in idx["files"]) <= 16 << 10
    assert not files["diff.patch.gz"]["truncated"] and not files["test.log.gz"]["truncated"]
    d = artifact_dir(tmp_path / "out", "t.0")
    stream = subprocess.run(["zcat", str(d / "agent.stdout.gz")], capture_output=True, text=True, check=True).stdout
    lines = [json.loads(line) for line in stream.splitlines()]
    assert lines[0]["type"] == "start" and lines[-1] == {"type": "assistant", "n": 20000}
    assert any("truncated_bytes" in line for line in lines)
    assert subprocess.run(["zcat", str(d / "test.log.gz")], capture_output=True, text=True).stdout == "1 passed\n"
