"""Build and run one scripted worker process (what ``farm engine serve`` does)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from farm.simulator.policies import make_policy
from farm.simulator.scoring import Scorer
from farm.simulator.server import ScriptedWorker, WorkerSettings, serve_worker
from farm.modeltext.tokenizer import load_tokenizer, resolve_tokenizer


def build_worker(
    *,
    policy: str,
    tokenizer: str,
    settings: WorkerSettings,
    tokenizer_cache_dir: str | None = None,
    tasks_path: str | None = None,
    replay_path: str | None = None,
    replies_path: str | None = None,
    tool_format: str = "hermes",
    scorer: Scorer | None = None,
    oracle_reads: int = 0,
) -> ScriptedWorker:
    """``scorer``: the model that samples choices and scores every token (None: made-up logprobs)."""
    path = resolve_tokenizer(tokenizer, tokenizer_cache_dir)
    tok = load_tokenizer(path)
    if scorer is not None and scorer.vocab_size < len(tok):
        raise ValueError(f"the model at {scorer.path} has {scorer.vocab_size} embeddings, the tokenizer "
                         f"{len(tok)} tokens")
    pol = make_policy(policy, seed=settings.seed, tool_format=tool_format, tasks_path=tasks_path,
                      replay_path=replay_path, replies_path=replies_path, oracle_reads=oracle_reads)
    if not settings.tokenizer_path:
        settings = settings.model_copy(update={"tokenizer_path": path})
    return ScriptedWorker(tok, pol, settings, scorer=scorer)


def _write_ready(path: str, url: str) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(url)
    os.replace(tmp, path)


async def serve_until_signal(worker: ScriptedWorker, host: str, port: int, ready_file: str | None = None) -> None:
    """Serve until SIGTERM/SIGINT. ``ready_file`` receives the base URL once listening
    (so a parent can use ``port=0`` and never race for a free port)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serve_worker(worker, host, port) as url:
        print(f"farm engine serve: {worker.policy.name} worker {worker.settings.worker_id} on {url}",
              file=sys.stderr, flush=True)
        if ready_file:
            _write_ready(ready_file, url)
        await stop.wait()
