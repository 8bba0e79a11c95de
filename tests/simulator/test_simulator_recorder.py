"""engine.simulator.record_path: a missing directory is made, an unusable path fails at start."""

from __future__ import annotations

import pytest

from farm.simulator.policy import PolicyRequest, SamplingParams
from farm.simulator.replay import Recorder


def test_record_path_in_a_missing_directory_is_created(tmp_path):
    rec = Recorder(tmp_path / "new" / "dir" / "rec.0")
    assert (tmp_path / "new" / "dir" / "rec.0").exists()  # opened at start, not at the first reply
    request = PolicyRequest(rid="r", input_ids=[1, 2], sampling=SamplingParams(), routing_key="k")
    rec.write(request, [3], "t", {"type": "stop"})
    rec.close()
    assert '"routing_key": "k"' in (tmp_path / "new" / "dir" / "rec.0").read_text()


def test_an_unusable_record_path_fails_at_start(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="engine.simulator.record_path .* cannot be opened"):
        Recorder(tmp_path / "file" / "rec.0")
