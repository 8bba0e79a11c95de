"""The driver's progress in a job log: one line per rollout up to LINES_PER_S a second,
then one line a second for the rest (a run ending 1,000 rollouts a second stays readable)."""

from __future__ import annotations

import io

from rich.console import Console

from farm.output.rows import RolloutSummary
from farm.run import progress as progress_mod
from farm.run.progress import LINES_PER_S, RunProgress
from farm.status import RolloutStatus


def _summary(i: int, status: RolloutStatus = RolloutStatus.COMPLETED) -> RolloutSummary:
    return RolloutSummary(rollout_id=f"t{i}.0", group_id=f"t{i}", task_id=f"t{i}", status=status, reward=1.0)


def test_rollouts_past_the_line_rate_are_summed_up_once_a_second(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    p = RunProgress(Console(file=out, force_terminal=False, width=400), 60, run_id="noop", out_dir="/data/runs/noop")
    # the run's id and where it writes, first (the id names its sandboxes, actors, report)
    assert out.getvalue() == "farm run noop: 60 rollouts to run into /data/runs/noop\n"
    for i in range(50):  # 50 rollouts in the same second
        p.advance(_summary(i, RolloutStatus.SANDBOX_ERROR if i % 10 == 9 else RolloutStatus.COMPLETED), 7)
    lines = out.getvalue().splitlines()[1:]
    assert len(lines) == LINES_PER_S and lines[0].startswith("[1/60] t0.0 completed")
    clock[0] += 1.0  # the next second: what was held is summed up, then lines again
    p.advance(_summary(50), 7)
    lines = out.getvalue().splitlines()[1:]
    assert lines[LINES_PER_S] == ("[50/60] 40 more rollouts ended (completed=36 sandbox_error=4) | in flight 7, "
                                  "1s elapsed, completed=45 sandbox_error=5")  # fmt: skip
    assert lines[LINES_PER_S + 1].startswith("[51/60] t50.0 completed")
    for i in range(51, 60):
        p.advance(_summary(i), 0)
    p.advance(_summary(60), 0)  # the 11th line of this second: held
    p.close()  # the run's end prints what is held
    assert out.getvalue().splitlines()[-1].startswith("[61/60] 1 more rollouts ended (completed=1)")
    assert p.done == 61 and p.by_status == {"completed": 56, "sandbox_error": 5}
