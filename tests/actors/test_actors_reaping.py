"""farm.actors.reaping without Ray: which sandbox roots the driver may reap itself."""

from __future__ import annotations

import pytest

from farm.actors.reaping import _reaped_here


@pytest.mark.parametrize("base_dir, fixed", [
    ("/tmp/farm-sandboxes", True),
    ("/scratch/sb", True),
    ("/shared/sb/$FARM_NODE_NAME", False),  # each node's raylet sets it: only a task there expands it
    ("/shared/sb/${FARM_NODE_NAME}/x", False),
    ("~/sb", False),  # the process's own home
])  # fmt: skip
def test_only_a_root_that_no_environment_changes_is_reaped_by_the_driver(base_dir, fixed):
    assert _reaped_here(base_dir) is fixed
