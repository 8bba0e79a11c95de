"""The TRL example of docs/how-to/trainer.md, run as it stands: TRL's real GRPOTrainer
trains farm's tiny CPU model for a step on a run with groups of two (runs/grpo, written
by the real reducer). In this process, not a subprocess: TRL's import (~15 s of CPU) is
paid once per test session, shared with tests/integrations/test_integrations_trl.py."""

from __future__ import annotations

import contextlib
import io

import pytest

from doc_snippets import DOCS, blocks

pytest.importorskip("trl")
pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # a real training step (~3-10 s on 2 cores), and TRL's import when first


def test_the_trl_example_trains_on_a_run_with_groups(scratch, monkeypatch):
    [block] = [b for b in blocks(DOCS / "how-to" / "trainer.md") if b.kind == "python" and "GRPOTrainer(" in b.code]
    assert block.marker == "tested-by" and "test_the_trl_example_trains_on_a_run_with_groups" in block.what
    monkeypatch.chdir(scratch)
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    printed = io.StringIO()
    names: dict = {"__name__": "__main__"}
    with contextlib.redirect_stdout(printed):
        exec(compile(block.code, block.where(), "exec"), names)  # noqa: S102 - the page's own code
    assert printed.getvalue().splitlines()[-1] == "trained 1 steps on 2 groups of 2"
    # it trained on farm's graded rewards: the two groups, rewarded (1, 0) and (0, 1)
    rewards = [log["reward"] for log in names["trainer"].state.log_history if "reward" in log]
    assert rewards and set(rewards) == {0.5}, names["trainer"].state.log_history
    assert names["source"].dropped_chains == 0 and names["source"].skipped_groups == []
