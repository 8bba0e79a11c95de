"""Engine test fixtures: in-process scripted workers and tool vocabularies of the real CLIs."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tok_path(tokenizer_dir: Path) -> str:
    return str(tokenizer_dir)


@pytest.fixture
async def make_worker(hf_tokenizer):
    """``await make_worker(policy, scorer=None, **WorkerSettings fields) -> (worker, url)``, served in this loop."""
    from farm.engine.scripted import ScriptedWorker, WorkerSettings, serve_worker

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
