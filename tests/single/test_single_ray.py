"""farm.Rollouts on Ray: the rollouts run on the farm's sandbox actor (a Ray actor, as
`farm run` starts them), their events stream back, an abort reaches the actor; the
reducer actor writes what is finalized. Real Claude Code, local sandboxes, the oracle."""

from __future__ import annotations

import pytest
import ray

from farm.single import Rollouts

from single_helpers import sandbox_left, single_config, stored_ids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_local(shared_ray):
    """The session's shared local Ray (tests/conftest.py; namespace "farm")."""


async def test_rollouts_on_the_farms_ray_actors(tmp_path):
    async with Rollouts(single_config(tmp_path), placement="ray") as service:
        done = await service.start("demo-wordfreq", harness="claude_code")
        doomed = await service.start("demo-wordfreq", harness="claude_code")
        async for ev in doomed.events():
            if ev["kind"] == "turn_finished":
                break
        assert (await doomed.messages())[-1]["role"] == "assistant"  # asked of the actor
        aborted = await doomed.abort()
        assert aborted["status"] == "aborted" and aborted["sandbox_id"], aborted
        assert not sandbox_left(tmp_path, aborted["sandbox_id"])

        kinds = [ev["kind"] async for ev in done.events()]
        assert "turn_finished" in kinds and "tool_call" in kinds and "agent_output" in kinds
        final = await done.finalize()
        assert final["status"] == "completed" and final["reward"] == 1.0 and final["stored"], final
        result = await done.result()
        assert result.actor == "farm-single-single-claude_code"  # the Ray actor that ran it
        assert ray.get_actor(result.actor, namespace="farm") is not None
        assert any(m["role"] == "tool" for m in await done.messages())
    samples, rows = stored_ids(tmp_path / "out")
    assert samples == rows == {done.id}
    with pytest.raises(ValueError):  # closing stopped the farm's actors
        ray.get_actor(result.actor, namespace="farm")
