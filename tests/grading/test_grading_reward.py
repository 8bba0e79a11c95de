"""A generic task's reward channel (``farm.grading.reward``): real grading of
demo-generic-fizzbuzz in real local sandboxes. Its verifier runs the workspace's code out
of process and gives its reward through farm's witness; tricks aimed at the reward (an
exit handler rewriting the reward file, the file's path guessed, the witness's socket
found) gain nothing and are named; a verifier of the old kind (the workspace's code
imported into its own process, the file written by hand) still grades, and a second
write to its file is a finding."""

from __future__ import annotations

import pytest

from farm.grading import GradeStatus, grade, grading_spec
from farm.tasks.loaders import load_tasks
from farm.tasks.model import Task
from testkit.grader_tricks import LEGACY_FIZZBUZZ_VERIFY, REWARD

LEGACY_VERIFY = LEGACY_FIZZBUZZ_VERIFY


@pytest.fixture
def fizzbuzz(tasks_cfg) -> Task:
    return load_tasks(tasks_cfg).by_id()["demo-generic-fizzbuzz"]


@pytest.fixture
def grader(runtime, new_sandbox):
    async def run(task: Task, patch: str):
        return await grade(task, patch, runtime=runtime, make_sandbox=lambda: new_sandbox(grading_spec(task)))

    return run


def _append(task: Task, extra: str) -> str:
    from farm.tasks.demo.generic import _FIZZBUZZ_STUB

    old, new = _FIZZBUZZ_STUB.splitlines(), (_FIZZBUZZ_STUB + extra).splitlines()
    body = "".join(f" {ln}\n" for ln in old) + "".join(f"+{ln}\n" for ln in new[len(old):])
    return f"diff --git a/fizzbuzz.py b/fizzbuzz.py\n--- a/fizzbuzz.py\n+++ b/fizzbuzz.py\n@@ -1,{len(old)} +1,{len(new)} @@\n{body}"


async def test_the_gold_patch_resolves_through_the_channel(fizzbuzz, grader):
    report = await grader(fizzbuzz, fizzbuzz.gold_patch)
    assert report.resolved and report.reward == 1.0 and report.reward_file_value == 1.0, (report.reason, report.flags)
    assert report.flags == [] and "30/30 correct" in report.verify[0].stdout_tail


async def test_farm_reward_file_is_set_without_a_rows_reward_file(fizzbuzz, grader):
    """A verifier that writes ``$FARM_REWARD_FILE`` as the docs say, on a row that names no
    reward_file: the variable is there (a fresh path outside the workspace) and counts."""
    task = fizzbuzz.model_copy(update={"reward_file": None, "verify_commands": [LEGACY_VERIFY]})
    report = await grader(task, fizzbuzz.gold_patch)
    assert report.resolved and report.reward_file_value == 1.0 and report.flags == [], (report.reason, report.verify)


@pytest.mark.parametrize("name, code, verifier, finding", REWARD, ids=[r[0] for r in REWARD])
async def test_reward_tricks_gain_nothing(fizzbuzz, grader, name, code, verifier, finding):
    task = fizzbuzz if verifier == "channel" else fizzbuzz.model_copy(update={"verify_commands": [LEGACY_VERIFY]})
    report = await grader(task, _append(task, code))
    assert report.reward == 0.0 and not report.resolved and report.status is GradeStatus.UNRESOLVED, report.reason
    assert finding in report.flags, (report.flags, report.reason, report.verify)
    if verifier == "legacy":  # the trick did work on the file: the finding took the reward away
        assert report.reward_before_hack_policy == 1.0
    # against a verifier that uses farm_verify, the trick cannot even write: an honest partial score
    if name == "reward_atexit":
        plain = await grader(fizzbuzz, _append(fizzbuzz, code))
        assert plain.reward == pytest.approx(16 / 30) and plain.flags == [], (plain.flags, plain.reason)


async def test_a_reward_given_twice_is_a_finding(fizzbuzz, grader):
    twice = "python -c 'import farm_verify; farm_verify.reward(0.5)'"
    task = fizzbuzz.model_copy(update={"verify_commands": [twice, twice]})
    report = await grader(task, fizzbuzz.gold_patch)
    assert "runtime:reward_written_twice" in report.flags and report.reward == 0.0, (report.flags, report.verify)


async def test_the_reward_file_written_after_the_channels_reward_is_a_finding(fizzbuzz, grader):
    """The verifier gives 0.5 through the channel; a later command writes 1.0 to the file."""
    task = fizzbuzz.model_copy(update={"verify_commands": [
        "python -c 'import farm_verify; farm_verify.reward(0.5)'", 'echo 1.0 > "$FARM_REWARD_FILE"']})
    report = await grader(task, fizzbuzz.gold_patch)
    assert "runtime:reward_file_rewritten" in report.flags and report.reward == 0.0, (report.flags, report.verify)
    assert report.reward_before_hack_policy == 0.5  # the channel's reward, not the file's
