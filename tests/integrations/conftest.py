"""A real farm output directory, written once per session (tests only read it)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer) -> Path:
    from integ_helpers import build_run

    return build_run(tmp_path_factory.mktemp("run"), hf_tokenizer)


@pytest.fixture(scope="session")
def groups(run_dir: Path):
    """The run's done, complete groups in task order."""
    from farm.output.groups import GroupReader

    return GroupReader(run_dir, order="task").read()
