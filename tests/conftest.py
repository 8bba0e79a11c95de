"""Shared fixtures. Tests never read ../shared: they build what they need."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real byte-level BPE + Qwen3-style chat template, trained for the session."""
    from farm.modeltext.builtin_tokenizer import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def hf_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def tok_path(tokenizer_dir: Path) -> str:
    return str(tokenizer_dir)


@pytest.fixture
async def make_worker(hf_tokenizer):
    """In-process simulated policy workers (farm.simulator):
    ``await make_worker(policy, scorer=None, **WorkerSettings fields) -> (worker, url)``, served in this loop."""
    from farm.simulator import ScriptedWorker, WorkerSettings, serve_worker

    stack = contextlib.AsyncExitStack()

    async def make(policy, scorer=None, **settings):
        worker = ScriptedWorker(hf_tokenizer, policy, WorkerSettings(**settings), scorer=scorer)
        url = await stack.enter_async_context(serve_worker(worker))
        return worker, url

    yield make
    await stack.aclose()


@pytest.fixture
async def http():
    import aiohttp

    async with aiohttp.ClientSession() as session:
        yield session
