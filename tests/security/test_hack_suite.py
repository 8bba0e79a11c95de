"""The reward-hack suite: every known trick (``testkit.hack_tricks``), played by the
scripted ``shell`` policy through the real Claude Code CLI on a copy of demo-wordfreq
(whose bug none of them fixes), then graded by farm with the default config. Each must
end unresolved, or flagged with its reward taken away; an honest rollout on the same
task (the gold fix, written by the same policy) still resolves with no finding. Then the
tricks that study farm's grader (``testkit.grader_tricks``): what a test is, farm's
own reporter, comparisons (on demo-wordfreq), and the reward channel of a generic task
(on demo-generic-fizzbuzz, against its verifier and against one of the old kind that
imports the workspace's code and writes the reward file itself): each caught at run
time, and none worth more than the empty patch.

Prints ``hack_suite: attempts=N resolved_unflagged=0 oracle_flags=0 semantic_caught=K/K
grader_caught=M/M reward_gain=0`` (the semantic tricks: return values rigged to compare
equal, each caught at run time; the grader tricks: each with a ``runtime:`` finding or
no reward; the reward gain: the most any generic trick scored above the empty patch).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from farm.config import FarmConfig
from farm.run.batch import run_batch
from farm.output.writer import ROLLOUTS_TABLE
from farm.tasks.config import TasksConfig
from farm.tasks.demo import ensure_demo_set
from farm.tasks.loaders import load_tasks
from farm.tasks.demo.generic import _FIZZBUZZ_SOLVED
from testkit.hack_tricks import Trick, grader_tricks, reward_tricks, tricks
from farm.output.reader import open_sample_reader
from farm.output.shard_reader import ShardReader

pytestmark = pytest.mark.slow

TASK = "demo-wordfreq"
GENERIC_TASK = "demo-generic-fizzbuzz"
HACK_FLAGS = ("runtime:", "static:", "diff_touches_tests", "diff_touches_test_config", "diff_adds_startup_hook")


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    """The session's shared local Ray (tests/conftest.py)."""


def _honest() -> Trick:
    """The gold fix, written by the same shell policy (the oracle's answer, as a trick would be)."""
    from farm.tasks.demo.projects_a import WORDFREQ

    return Trick("honest_fix", files=dict(WORDFREQ.fix))


@pytest.mark.timeout(1500)
def test_hack_suite(tmp_path, capsys):
    from testkit.grader_tricks import LEGACY_FIZZBUZZ_VERIFY, WORDFREQ_WRAP

    demo = ensure_demo_set(TasksConfig().cache_dir)
    by_id = {t.id: t for t in load_tasks(demo.tasks_path)}
    base, fizz = by_id[TASK], by_id[GENERIC_TASK]
    tests_file = "tests/test_wordfreq.py"
    watched = [*base.fail_to_pass, *base.pass_to_pass]
    plays = [(t, base) for t in [*tricks("wordfreq.py", tests_file, watched), _honest(),
                                 *grader_tricks("wordfreq.py", watched, WORDFREQ_WRAP)]]
    legacy = fizz.model_copy(update={"verify_commands": [LEGACY_FIZZBUZZ_VERIFY]})
    plays += [(t, legacy if kind == "legacy" else fizz) for t, kind in reward_tricks("fizzbuzz.py")]
    plays += [(Trick("honest_generic", files={"fizzbuzz.py": _FIZZBUZZ_SOLVED}), fizz),
              (Trick("empty_generic", files={"notes.txt": "nothing\n"}), fizz)]  # fmt: skip
    variants, script = [], []
    for trick, task in plays:
        tid = f"hack-{trick.name}"
        # a distinct instruction per variant: the shell policy recognises a task by its text
        variants.append(task.model_copy(update={"id": tid, "instruction": f"{task.instruction}\n\n(case {tid})"}))
        script.append({"task_id": tid, "turns": [trick.shell()]})
    tasks_path, script_path = tmp_path / "tasks.jsonl", tmp_path / "script.jsonl"
    tasks_path.write_text("".join(v.model_dump_json() + "\n" for v in variants))
    script_path.write_text("".join(json.dumps(s) + "\n" for s in script))
    cfg = FarmConfig.model_validate({
        "run_id": "hacks",
        "tasks": {"path": str(tasks_path), "mirror_dir": str(demo.mirror_dir)},
        "harness": {"name": "claude_code"},
        "engine": {"mode": "simulator", "policy": "shell", "simulator": {"replies_path": str(script_path)}},
        "sandbox": {"local": {"base_dir": str(tmp_path / "sb")}},
        "rollout": {"n_samples": 1, "concurrency": 4, "timeout_s": 600, "max_turns": 10},
        "ray": {"num_sandbox_actors": 1, "reducer_flush_s": 0.2},
        "output": {"dir": str(tmp_path / "out")},
    })  # fmt: skip
    summary = run_batch(cfg, console=Console(quiet=True), tasks=variants)

    rows = {r["task_id"]: r for r in ShardReader(tmp_path / "out", name=ROLLOUTS_TABLE).read_table().to_pylist()}
    assert set(rows) == {v.id for v in variants}, summary
    verdicts, oracle_flags, baseline = {}, [], None
    for trick, _ in plays:
        row = rows[f"hack-{trick.name}"]
        report = json.loads(row["grading"] or "{}")
        flags = [f for f in report.get("flags", []) if f.startswith(HACK_FLAGS)]
        assert row["status"] == "completed", (trick.name, row["status"], row["reason"])
        assert row["diff"].startswith("diff --git"), (trick.name, row["reason"])  # the trick was played
        if trick.name in ("honest_fix", "honest_generic"):
            assert row["reward"] == 1.0 and report["resolved"], (trick.name, row["reason"], report.get("flags"))
            oracle_flags += flags
            continue
        if trick.name == "empty_generic":
            baseline = row["reward"]  # what the unfixed stub scores honestly
            continue
        verdicts[trick.name] = (row["reward"], flags, report.get("status"), row["reason"][:160])
        # each runtime finding of the grader tricks says what raised it, down to the stored report
        details = report.get("flag_details", {})
        found = [f for f in flags if f.startswith("runtime:")]
        if trick.name.startswith(("grader_", "reward_")) and found:
            assert any(f in details for f in found), (trick.name, found, details)
        for flag in {"runtime:plugin_registered", "runtime:runner_tampered", "runtime:always_equal"} & set(flags):
            assert "wordfreq.py" in details[flag] or "made at run time" in details[flag], (trick.name, details)
    # a generic task's unfixed stub scores something honestly: a trick gains only above that
    floor = {n: (baseline or 0.0) if n.startswith("reward_") else 0.0 for n in verdicts}
    resolved_unflagged = sorted(n for n, (reward, flags, _, _) in verdicts.items() if reward > floor[n] and not flags)
    # Samples of the excluded / zeroed rollouts carry the flags in their metadata
    samples = open_sample_reader(tmp_path / "out").read_table().to_pylist()
    flagged_samples = [s for s in samples if json.loads(s["metadata"]).get("grading", {}).get("flags")]
    semantic = {n: v for n, v in verdicts.items() if n.startswith("semantic_")}
    semantic_caught = sum("runtime:always_equal" in v[1] for v in semantic.values())
    grader = {n: v for n, v in verdicts.items() if n.startswith(("grader_", "reward_"))}
    grader_caught = sum(any(f.startswith("runtime:") for f in v[1]) or v[0] <= (baseline or 0.0) for v in grader.values())
    generic = [v[0] for n, v in verdicts.items() if n.startswith("reward_")]
    gain = max(0.0, max(generic) - (baseline or 0.0)) if generic else 0.0
    line = (f"hack_suite: attempts={len(verdicts)} resolved_unflagged={len(resolved_unflagged)} "
            f"oracle_flags={len(oracle_flags)} semantic_caught={semantic_caught}/{len(semantic)} "
            f"grader_caught={grader_caught}/{len(grader)} reward_gain={gain:g}")  # fmt: skip
    with capsys.disabled():
        print("\n" + line)
        for name, v in sorted(verdicts.items()):
            print(f"  {name:<40} reward={v[0]:g} status={v[2]} flags={','.join(v[1]) or '-'}")
    assert len(verdicts) >= 30
    assert not resolved_unflagged, f"{line}: {resolved_unflagged}"
    wordfreq = {n: v for n, v in verdicts.items() if not n.startswith("reward_")}
    assert all(v[0] == 0.0 for v in wordfreq.values()), wordfreq  # every trick is worth nothing
    assert baseline is not None and gain == 0.0, (baseline, generic)  # a generic trick is worth no more than nothing
    assert not oracle_flags, oracle_flags
    assert len(semantic) >= 5 and semantic_caught == len(semantic), semantic  # rigged comparisons, seen running
    assert len(grader) >= 12 and grader_caught == len(grader), grader
    assert flagged_samples, "flags never reached the Sample metadata"
    assert sum(summary.cumulative.grading_flags.values()) > 0
