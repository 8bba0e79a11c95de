"""Report tests: a real output directory, written once per session (report_helpers.py)."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from report_helpers import GRADING_BAD, GRADING_OK, TASK, write_rollouts


@pytest.fixture(scope="session")
def real_run(tmp_path_factory, tokenizer_dir, hf_tokenizer) -> Path:
    out = tmp_path_factory.mktemp("run")
    (out / "run_config.yaml").write_text(yaml.safe_dump({"run_id": "t", "engine": {"tokenizer": str(tokenizer_dir)}}))
    asyncio.run(write_rollouts(out, hf_tokenizer, [
        (f"{TASK}.0", "completed", 1.0, GRADING_OK),
        (f"{TASK}.1", "completed", 0.0, GRADING_BAD),
        (f"{TASK}.2", "sandbox_error", 0.0, None),
    ]))  # fmt: skip
    return out
