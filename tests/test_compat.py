"""Old module paths keep working for one release (issue 29 moved them): each old name
imports, warns that it moved, and hands out the very objects of its new home."""

from __future__ import annotations

import importlib
import sys

import pytest

MOVED = {  # old module -> (new module, names a user of the old one relies on)
    "farm.rollout.runlock": ("farm.run.lock", ["RunLock", "RunLocked"]),
    "farm.rollout.signals": ("farm.run.signals", ["stop_signals", "cleanup_phase"]),
    "farm.rollout.progress": ("farm.run.progress", ["RunProgress"]),
    "farm.rollout.stream": ("farm.run.stream", ["StreamConfig", "TaskStream", "StreamFeed", "Curriculum"]),
    "farm.rollout.summary": ("farm.run.summary", ["RunSummary", "summarize", "write_summary", "directory_summary"]),
    "farm.rollout.tasks": ("farm.run.tasks", ["load_run_tasks"]),
    "farm.rollout.plan": ("farm.run.stream", ["expand_rollouts"]),
    "farm.driver": ("farm.run.batch", ["run_batch"]),
    "farm.continuous": ("farm.run.continuous", ["Farm", "FarmStopped"]),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_still_imports_and_says_where_it_went(old):
    new, names = MOVED[old]
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"moved to {new}"):
        shim = importlib.import_module(old)
    home = importlib.import_module(new)
    assert all(getattr(shim, name) is getattr(home, name) for name in names)


def test_the_old_entry_points_are_the_new_ones():
    sys.modules.pop("farm.driver", None)
    with pytest.warns(DeprecationWarning, match="farm.run.batch"):
        from farm.driver import run_farm
    from farm.run.batch import run_batch

    assert run_farm is run_batch

    import farm
    from farm.run.continuous import Farm, FarmStopped

    assert (farm.Farm, farm.FarmStopped) == (Farm, FarmStopped)  # the face's lazy names: the new home
