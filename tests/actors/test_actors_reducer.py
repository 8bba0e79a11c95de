"""ReducerActor (in-process, real Arrow files): durable acks, exactly once, crash resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

from farm.actors.reducer import ReducerActor
from farm.status import RolloutStatus
from farm.trajectory.schema import samples_to_table, table_to_samples

import farm_helpers
from farm_helpers import make_result, reducer_config
from testkit.waits import wait_until

# the writer subprocess imports the shared helpers too: pytest's pythonpath (pyproject) is not
# a child's, so it gets their directory on PYTHONPATH
CHILD_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (str(Path(farm_helpers.__file__).parent), os.environ.get("PYTHONPATH", "")) if p)}


def _manifest_ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [rid for line in path.read_text().splitlines() if line.strip() for rid in json.loads(line)["rollout_ids"]]


def _tables(out: Path):
    samples = ds.dataset(out / "samples", format="ipc").to_table()
    rollouts = ds.dataset(out / "rollouts", format="ipc").to_table()
    return samples, rollouts


async def test_submit_is_durable_and_exactly_once(tmp_path):
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    results = [make_result("a.0"), make_result("a.1", reward=0.0),
               make_result("b.0", status=RolloutStatus.SETUP_FAILED, reward=0.0, turns=0)]
    acks = await asyncio.gather(*(red.submit(r) for r in results), red.submit(results[0]))
    # Acknowledged = already in the manifests (durable), before any explicit flush.
    assert sorted(_manifest_ids(tmp_path / "rollouts.manifest.jsonl")) == ["a.0", "a.1", "b.0"]
    assert sorted(_manifest_ids(tmp_path / "manifest.jsonl")) == ["a.0", "a.1", "b.0"]
    assert [a.status for a in acks[:3]] == [RolloutStatus.COMPLETED, RolloutStatus.COMPLETED, RolloutStatus.SETUP_FAILED]
    assert acks[3] == acks[0]
    # A later duplicate (re-dispatch) is a no-op that returns the first stored result.
    again = await red.submit(make_result("a.0", status=RolloutStatus.TIMEOUT, reward=0.0))
    assert again.status is RolloutStatus.COMPLETED and again.reward == 1.0
    # Cancelled rollouts are never stored (a rerun runs them).
    c = await red.submit(make_result("c.0", status=RolloutStatus.CANCELLED, reward=0.0))
    assert c.durable is False and "c.0" not in await red.done_ids()
    await red.close()
    samples, rollouts = _tables(tmp_path)
    assert sorted(rollouts.column("rollout_id").to_pylist()) == ["a.0", "a.1", "b.0"]
    assert sorted(samples.column("rollout_id").to_pylist()) == ["a.0", "a.1"]  # b.0 had no turns
    rows = {r["rollout_id"]: r for r in rollouts.to_pylist()}
    assert json.loads(rows["a.0"]["grading"])["resolved"] is True
    assert rows["a.0"]["turns"] == 2 and rows["a.0"]["output_tokens"] == 4 and rows["a.0"]["num_samples"] == 1
    assert rows["b.0"]["status"] == "setup_failed" and rows["b.0"]["reason"] == "because"
    for s in table_to_samples(samples):
        assert s.reward == rows[s.rollout_id]["reward"]
        assert s.metadata["grading"] == {"resolved": s.reward == 1.0}  # compact: scalars only
        np.testing.assert_array_equal(s.tokens[s.prompt_length:][s.loss_mask == 1], [100, 101, 101, 102])


async def test_the_reducer_decides_every_attempts_end(tmp_path):
    """Every attempt ends at the reducer, which alone decides what becomes of it: one a sandbox
    actor finished (``FINISHED``), and each the dispatcher saw end around the pipeline (the
    result's ``ending``). Each kind spends its own budget; a bug in farm and a rollout given up
    are recorded at once; once the run stops, what did not finish to its end is dropped."""
    from farm.config import FarmConfig
    from farm.rollout.model import RolloutSpec, Runner, RolloutResult
    from farm.rollout.outcome import Ending, outcome_for_ending
    from farm.rollout.retry import Reruns
    from farm.status import RetryKind, Verdict
    from farm.tasks.model import Task

    cfg = FarmConfig.model_validate({"run_id": "t", "output": {"dir": str(tmp_path)}, "ray": {"reducer_flush_s": 0.05},
                                     "rollout": {"infra_retries": 1, "max_attempts": 2, "retry_backoff_s": 0.5}})
    red = ReducerActor(cfg, metrics=False)

    def ended(rid: str, ending: Ending, why: str, reruns: Reruns = Reruns()):  # what the dispatcher hands over
        spec = RolloutSpec(run_id="t", rollout_id=rid, group_id=rid[0], sample_index=int(rid[-1]),
                           task=Task(id=rid[0], instruction="x"), reruns=reruns)  # fmt: skip
        return RolloutResult.of(spec, Runner.of(cfg, actor="a0"), outcome_for_ending(ending, why), started_at=1.0,
                                finished_at=1.0, ending=ending)  # fmt: skip

    def again(summary, kind: RetryKind) -> bool:
        return not summary.durable and summary.retry.verdict is Verdict.RUN_AGAIN and summary.retry.kind is kind

    # finished with an infrastructure failure: run again (after its backoff), until its budget is spent
    first = await red.submit(make_result("a.0", status=RolloutStatus.ENGINE_ERROR, reward=0.0))
    assert again(first, RetryKind.INFRASTRUCTURE) and first.retry.delay_s == 0.5 and first.status is RolloutStatus.ENGINE_ERROR
    spent = make_result("a.0", status=RolloutStatus.ENGINE_ERROR, reward=0.0).model_copy(update={"reruns": Reruns(infrastructure=1)})
    assert (await red.submit(spent)).durable
    # a bug in farm inside the pipeline (deterministic) and one in the actor around it: recorded at once
    bug = make_result("b.0", status=RolloutStatus.SANDBOX_ERROR, reward=0.0).model_copy(update={"deterministic": True})
    assert (await red.submit(bug)).durable
    raised = await red.submit(ended("b.1", Ending.ACTOR_FAILED, "sandbox actor raised: KeyError: 'x'"))
    assert raised.durable and raised.status is RolloutStatus.SANDBOX_ERROR and "KeyError" in raised.reason
    given_up = await red.submit(ended("b.2", Ending.GIVEN_UP, "no sandbox actor left alive"))
    assert given_up.durable and given_up.reason == "no sandbox actor left alive"
    # an actor lost under it: its own budget; once spent, recorded with the count and the last cause
    assert again(await red.submit(ended("c.0", Ending.ACTOR_LOST, "RayActorError: died")), RetryKind.ACTOR_LOST)
    lost = await red.submit(ended("c.0", Ending.ACTOR_LOST, "RayActorError: died again", Reruns(actor_lost=1)))
    assert lost.durable and lost.status is RolloutStatus.SANDBOX_ERROR
    assert lost.reason == "sandbox actor died 2 time(s) under this rollout (last: RayActorError: died again)"
    # hung: the infrastructure budget (an actor that did not answer is an infrastructure failure)
    assert again(await red.submit(ended("d.0", Ending.HUNG, "rollout exceeded 60 s")), RetryKind.INFRASTRUCTURE)
    # aborted as stale at a weight update: the stale budget
    assert again(await red.submit(ended("d.1", Ending.TOO_STALE, "aborted as stale")), RetryKind.STALE)
    # an actor lost after it stored the rollout: what is stored is the answer (first write wins)
    assert (await red.submit(ended("a.0", Ending.ACTOR_LOST, "died"))).status is RolloutStatus.ENGINE_ERROR
    # the run stops: what ends now is dropped for the next invocation, but a rollout graded to its end
    await red.stop_accepting()
    dropped = await red.submit(make_result("e.0", status=RolloutStatus.SANDBOX_ERROR, reward=0.0))
    assert not dropped.durable and dropped.retry.verdict is Verdict.DROP and dropped.status is RolloutStatus.INTERRUPTED
    assert (await red.submit(make_result("e.1"))).durable
    await red.close()
    assert sorted(await red.done_ids()) == ["a.0", "b.0", "b.1", "b.2", "c.0", "e.1"]


@pytest.mark.parametrize("on_truncated", ["grade", "exclude"])
async def test_truncated_samples_are_marked_or_excluded(tmp_path, on_truncated):
    from farm.trajectory.records import Budget, BudgetStop

    cfg = reducer_config(tmp_path)
    cfg.rollout.on_truncated = on_truncated
    red = ReducerActor(cfg, metrics=False)
    cut = make_result("a.0", status=RolloutStatus.TRUNCATED, reward=1.0)
    cut.tree.budget_stop = BudgetStop(budget=Budget.OUTPUT, limit=16384, turns=2)
    ack = await red.submit(cut)
    assert ack.status is RolloutStatus.TRUNCATED and ack.attempt == 1
    await red.close()
    samples, rollouts = _tables(tmp_path)
    (row,) = rollouts.to_pylist()
    assert row["status"] == "truncated" and row["reward"] == 1.0  # the row is kept either way, with its reward
    if on_truncated == "exclude":  # DAPO-style overlong filtering: no Sample
        assert samples.num_rows == 0 and row["num_samples"] == 0
        return
    (sample,) = table_to_samples(samples)
    assert sample.status == "truncated" and sample.reward == 1.0 and sample.loss_mask.sum() == 4
    assert sample.metadata["truncated"] is True
    assert sample.metadata["truncated_by"] == {"budget": "output", "limit": 16384, "turns": 2}


async def test_a_hack_the_grading_excluded_keeps_its_row_and_writes_no_samples(tmp_path):
    """The hack verdict travels as ``RolloutResult.hack_action`` (typed, from the grading
    report): ``exclude`` writes no Sample, ``zero_reward`` (its reward already 0) still does."""
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(make_result("a.0", reward=0.0).model_copy(update={"hack_action": "exclude"}))
    await red.submit(make_result("b.0", reward=0.0).model_copy(update={"hack_action": "zero_reward"}))
    await red.close()
    samples, rollouts = _tables(tmp_path)
    assert sorted(rollouts.column("rollout_id").to_pylist()) == ["a.0", "b.0"]  # both rows kept
    assert samples.column("rollout_id").to_pylist() == ["b.0"]


async def test_the_rollout_mode_decides_samples_or_transcripts(tmp_path):
    """A black-box rollout (RolloutMode.BLACK_BOX, its record a Transcript) is written to the
    transcripts table and never becomes a Sample, however trainable its status; a token-exact
    one beside it does."""
    from farm.gateway.endpoints import RolloutMode
    from farm.output.rows import counts_of
    from farm.trajectory.records import FinishReason
    from farm.trajectory.transcript import Transcript, TranscriptTurn

    transcript = Transcript("h.0", "ep")
    transcript.turns.append(TranscriptTurn(
        messages=[{"role": "user", "content": "fix it"}], tools=["Bash"], finish_reason=FinishReason.STOP,
        response={"role": "assistant", "content": "done"}, protocol="anthropic", model="claude-x",
        prompt_tokens=12, output_tokens=3))  # fmt: skip
    hosted = make_result("h.0").model_copy(update={"mode": RolloutMode.BLACK_BOX, "tree": transcript,
                                                   "counts": counts_of(transcript)})  # fmt: skip
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    for result in (hosted, make_result("a.0")):
        assert (await red.submit(result)).status is RolloutStatus.COMPLETED
    await red.close()
    samples, rollouts = _tables(tmp_path)
    rows = {r["rollout_id"]: r for r in rollouts.to_pylist()}
    assert (rows["h.0"]["mode"], rows["h.0"]["num_samples"], rows["h.0"]["output_tokens"]) == ("black_box", 0, 3)
    assert (rows["a.0"]["mode"], rows["a.0"]["num_samples"]) == ("token_exact", 1)
    assert samples.column("rollout_id").to_pylist() == ["a.0"]
    turns = ds.dataset(tmp_path / "transcripts", format="ipc").to_table().to_pylist()
    assert [(t["rollout_id"], t["endpoint"], t["output_tokens"]) for t in turns] == [("h.0", "ep", 3)]


async def test_restart_resumes_from_manifest(tmp_path):
    red = ReducerActor(reducer_config(tmp_path), metrics=False)
    await red.submit(make_result("a.0"))
    await red.close()
    red2 = ReducerActor(reducer_config(tmp_path), metrics=False)
    assert await red2.done_ids() == ["a.0"]
    assert (await red2.lookup("a.0")).reward == 1.0
    await red2.submit(make_result("a.0", reward=0.0))
    await red2.submit(make_result("a.1"))
    await red2.close()
    samples, rollouts = _tables(tmp_path)
    assert sorted(rollouts.column("rollout_id").to_pylist()) == ["a.0", "a.1"]
    assert sorted(samples.column("rollout_id").to_pylist()) == ["a.0", "a.1"]


async def test_crash_between_tables_rebuilds_the_row(tmp_path):
    cfg = reducer_config(tmp_path)
    red = ReducerActor(cfg, metrics=False)
    samples = red._linearize(make_result("a.0", reward=0.75))
    red.store.samples.write_rollout("a.0", samples_to_table(samples))
    red.store.samples.flush()  # crash here: Samples durable, row not
    red.store.close()
    red2 = ReducerActor(cfg, metrics=False)
    assert await red2.done_ids() == ["a.0"]
    got = await red2.lookup("a.0")
    assert got.reward == 0.75 and got.status is RolloutStatus.COMPLETED
    await red2.close()
    _, rollouts = _tables(tmp_path)
    (row,) = rollouts.to_pylist()
    assert "rebuilt" in row["reason"] and row["num_samples"] == 1 and row["turns"] == 2


WRITER = textwrap.dedent(
    """
    import asyncio
    from farm.actors.reducer import ReducerActor
    from farm_helpers import make_result, reducer_config

    async def main():
        red = ReducerActor(reducer_config({out!r}, shard_max_rows=3), metrics=False)
        done = set(await red.done_ids())
        todo = [f"t{{i}}.0" for i in range(200) if f"t{{i}}.0" not in done]
        print("todo", len(todo), flush=True)
        for i in range(0, len(todo), 4):
            await asyncio.gather(*(red.submit(make_result(r, reward=float(int(r[1:-2]) % 2))) for r in todo[i:i+4]))
        await red.close()
        print("done", flush=True)
    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_loses_nothing_duplicates_nothing(tmp_path):
    script = WRITER.format(out=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
    assert proc.stdout.readline().startswith("todo 200")
    wait_until(lambda: len(_manifest_ids(tmp_path / "rollouts.manifest.jsonl")) >= 20, timeout_s=60,
               interval_s=0.01, what="20 rollouts committed")  # fmt: skip
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    partial = _manifest_ids(tmp_path / "rollouts.manifest.jsonl")
    assert 20 <= len(partial) < 200 and len(partial) == len(set(partial))
    durable_before = set(partial) | set(_manifest_ids(tmp_path / "manifest.jsonl"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=CHILD_ENV)
    assert out.returncode == 0, out.stderr
    # A shard whose file was complete but not yet listed when the kill came is adopted by the
    # rerun (its Samples are committed; its manifest line comes back marked adopted): the rerun
    # runs exactly what neither the manifests nor an adopted shard held. (A group commit takes
    # every row buffered when it runs, so a shard may hold more than shard_max_rows.)
    todo = int(out.stdout.split("\n", 1)[0].removeprefix("todo "))
    lines = [json.loads(line) for name in ("manifest.jsonl", "rollouts.manifest.jsonl")
             for line in (tmp_path / name).read_text().splitlines() if line.strip()]  # fmt: skip
    adopted = {rid for entry in lines if entry.get("adopted") for rid in entry["rollout_ids"]}
    assert bool(adopted) == ("adopted" in out.stderr), out.stderr
    assert todo == 200 - len(durable_before | adopted), (todo, len(durable_before), out.stderr)
    rows_ids = _manifest_ids(tmp_path / "rollouts.manifest.jsonl")
    sample_ids = _manifest_ids(tmp_path / "manifest.jsonl")
    assert sorted(rows_ids) == sorted(set(rows_ids)) == sorted(f"t{i}.0" for i in range(200))
    assert sorted(sample_ids) == sorted(set(sample_ids)) == sorted(rows_ids)
    samples, rollouts = _tables(tmp_path)
    assert rollouts.num_rows == 200 and samples.num_rows == 200
    rewards = dict(zip(rollouts.column("rollout_id").to_pylist(), rollouts.column("reward").to_pylist()))
    assert all(rewards[r] == float(int(r[1:-2]) % 2) for r in rewards)
