"""Docs tests: the site built once per session (mkdocs --strict), and a scratch directory
shaped like a checkout after `bash scripts/run.sh` for the pages' snippets to run in."""

from __future__ import annotations

import asyncio
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from doc_site import build_site

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("site") / "site"
    res = build_site(dest)
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{res.stdout}\n{res.stderr}"
    return dest


def _report_kit():
    """tests/report's writer of a real output directory (sessions recorded through the real
    gateway over the scripted worker, written by the ReducerActor), loaded by path."""
    spec = importlib.util.spec_from_file_location("report_kit", ROOT / "tests" / "report" / "report_helpers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, tokenizer_dir, hf_tokenizer) -> Path:
    """A small real output directory: two graded rollouts of one task (reward 1 and 0) and
    an infrastructure failure, with artifacts and run_config.yaml naming the tokenizer."""
    kit = _report_kit()
    out = tmp_path_factory.mktemp("demo-run") / "local"
    out.mkdir()
    (out / "run_config.yaml").write_text(yaml.safe_dump({"run_id": "local", "engine": {"tokenizer": str(tokenizer_dir)}}))
    asyncio.run(kit.write_rollouts(out, hf_tokenizer, [
        (f"{kit.TASK}.0", "completed", 1.0, kit.GRADING_OK),
        (f"{kit.TASK}.1", "completed", 0.0, kit.GRADING_BAD),
        (f"{kit.TASK}.2", "sandbox_error", 0.0, None),
    ]))  # fmt: skip
    return out


@pytest.fixture(scope="session")
def grpo_run(tmp_path_factory, tokenizer_dir, hf_tokenizer) -> Path:
    """A run with groups (``--set rollout.n_samples=2 --set output.dir=runs/grpo``, the
    trainer how-to's): two tasks, each a group of two rollouts rewarded 1 and 0."""
    kit = _report_kit()
    out = tmp_path_factory.mktemp("grpo-run") / "grpo"
    out.mkdir()
    (out / "run_config.yaml").write_text(yaml.safe_dump({"run_id": "grpo", "rollout": {"n_samples": 2},
                                                         "engine": {"tokenizer": str(tokenizer_dir)}}))  # fmt: skip
    asyncio.run(kit.write_rollouts(out, hf_tokenizer, [
        (f"{task}.{i}", "completed", reward, kit.GRADING_OK if reward else kit.GRADING_BAD)
        for task, rewards in (("calc__fix-divide", (1.0, 0.0)), ("calc__fix-modulo", (0.0, 1.0)))
        for i, reward in enumerate(rewards)
    ]))  # fmt: skip
    return out


@pytest.fixture
def scratch(tmp_path, demo_run, grpo_run) -> Path:
    """A working directory like a checkout after a run: configs/, examples/, scripts/,
    docs/ and .venv/ of this checkout, runs/local (a copy: snippets may write) and runs/grpo
    (a run with groups)."""
    for name in ("configs", "examples", "scripts", "docs"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copytree(demo_run, tmp_path / "runs" / "local")
    shutil.copytree(grpo_run, tmp_path / "runs" / "grpo")
    (tmp_path / "home").mkdir()
    return tmp_path
