"""Real farm output directories for the trainer-adapter tests (not a test module).

Written through the real writer path without Ray: session trees built with
``TurnTree`` from the test tokenizer's chat template, submitted to an in-process
``ReducerActor`` (linearization, Sample + rollouts shards, manifests). Groups of
``N`` rollouts; multi-chain rollouts (main + retry branch + sub-agent fork); one
infrastructure failure (its group is incomplete).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from farm.actors.reducer import ReducerActor
from farm.config import FarmConfig
from farm.rollout.model import RolloutResult
from farm.output.rows import counts_of
from farm.status import RolloutStatus
from farm.trajectory.tree import TurnTree

N = 2  # rollouts per group


@dataclass(frozen=True)
class Spec:
    rollout_id: str
    reward: float = 1.0
    multi: bool = False  # main + branch (retry) + fork (sub-agent) chains
    status: RolloutStatus = RolloutStatus.COMPLETED

    @property
    def task_id(self) -> str:
        return self.rollout_id.rsplit(".", 1)[0]

    @property
    def sample_index(self) -> int:
        return int(self.rollout_id.rsplit(".", 1)[1])


# 5 groups: t2 lost a rollout to infrastructure (incomplete); t0.1 and t3.0 have 3 chains.
SPECS = [
    Spec("t0.0", 1.0), Spec("t0.1", 0.0, multi=True),
    Spec("t1.0", 0.0), Spec("t1.1", 1.0),
    Spec("t2.0", 1.0), Spec("t2.1", 0.0, status=RolloutStatus.SANDBOX_ERROR),
    Spec("t3.0", 1.0, multi=True), Spec("t3.1", 0.0),
    Spec("t4.0", 0.5), Spec("t4.1", 0.0),
]  # fmt: skip
COMPLETE = ["t0", "t1", "t3", "t4"]


def _ids(tok: Any, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _lp(n: int, seed: int) -> list[float]:
    """Distinct, recognisable logprobs per turn."""
    return [-(seed % 97) / 100 - i / 1000 - 0.001 for i in range(n)]


def make_tree(tok: Any, spec: Spec) -> TurnTree:
    """A session: system+user prompt, a tool call, its result, a final answer; with
    ``multi`` also a retried first turn (branch) and a sub-agent (fork).
    Turns are appended so the main path's turn is the session's last."""
    tree = TurnTree(spec.rollout_id)
    seed = sum(map(ord, spec.rollout_id))
    prompt = tok.apply_chat_template(
        [{"role": "system", "content": "You fix bugs."},
         {"role": "user", "content": f"Fix the test in {spec.task_id}."}],
        add_generation_prompt=True, tokenize=True, return_dict=False,
    )
    tool_result = _ids(tok, "\n<|im_start|>user\n<tool_response>\n1 failed\n</tool_response><|im_end|>\n"
                            "<|im_start|>assistant\n")

    def add(parent: str | None, delta: list[int], text: str, k: int) -> str:
        out = _ids(tok, text + "<|im_end|>")
        return tree.append(parent_id=parent, prompt_delta_ids=delta, output_ids=out,
                           output_logprobs=_lp(len(out), seed + k), finish_reason="stop",
                           policy_version=3 + (k % 2)).turn_id  # fmt: skip

    root = add(None, prompt, '<tool_call>\n{"name": "Bash", "arguments": {"command": "pytest"}}\n</tool_call>', 0)
    if spec.multi:
        add(root, tool_result, "let me look again", 1)  # a retry from the same parent: branch
        sub = tok.apply_chat_template([{"role": "user", "content": "Find the failing test."}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        add(None, sub, "tests/test_x.py", 2)  # a sub-agent: fork (a new root)
    add(root, tool_result, "fixed the bug in the file", 3)
    return tree


def make_result(tok: Any, spec: Spec, group_index: int) -> RolloutResult:
    tree = make_tree(tok, spec)
    return RolloutResult(
        run_id="integ", rollout_id=spec.rollout_id, group_id=spec.task_id, task_id=spec.task_id,
        sample_index=spec.sample_index, group_index=group_index, harness="claude_code", model="farm-policy",
        status=spec.status, reason="" if spec.status is RolloutStatus.COMPLETED else "injected",
        reward=spec.reward if spec.status.trainable else 0.0, grading={"resolved": spec.reward == 1.0},
        counts=counts_of(tree), sandbox_id="sb", started_at=1.0, finished_at=2.0, tree=tree,
    )  # fmt: skip


def reducer_config(out_dir: Path) -> FarmConfig:
    """A reducer that records every row it is handed (no infrastructure reruns: the reducer
    decides retries, and these runs are written with rows of every status)."""
    return FarmConfig.model_validate({"run_id": "integ", "output": {"dir": str(out_dir)},
                                      "rollout": {"n_samples": N, "infra_retries": 0}, "ray": {"reducer_flush_s": 0.01}})


def write_config(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "run_config.yaml").write_text(yaml.safe_dump({"rollout": {"n_samples": N}}))


async def submit(out_dir: Path, tok: Any, specs: list[Spec]) -> None:
    """Make ``specs`` durable in ``out_dir``, submitted at once (so a group commit, one
    shard per table, holds several rollouts)."""
    red = ReducerActor(reducer_config(out_dir), metrics=False)
    tasks = sorted({s.task_id for s in SPECS})
    await asyncio.gather(*(red.submit(make_result(tok, spec, tasks.index(spec.task_id))) for spec in specs))
    await red.close()


def build_run(out_dir: Path, tok: Any, specs: list[Spec] = SPECS) -> Path:
    write_config(out_dir)
    asyncio.run(submit(out_dir, tok, specs))
    return out_dir


# ---- a run served by a model (farm's tiny CPU LM behind the scripted worker) ----------------
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


async def _model_sessions(tok: Any, model_path: str, rollout_ids: list[str]) -> dict[str, TurnTree]:
    """One chat session per rollout through the real gateway: a tool call, its result, an
    answer; every output token scored by the model at ``model_path``."""
    import aiohttp

    from farm.engine.client import EngineClient
    from farm.simulator import ScriptedPolicy, ScriptedWorker, WorkerSettings, serve_worker
    from farm.gateway.config import GatewayConfig
    from farm.gateway.gateway import Gateway
    from farm.simulator.lm import LMScorer

    policy = ScriptedPolicy()
    worker = ScriptedWorker(tok, policy, WorkerSettings(), scorer=LMScorer.from_path(model_path))
    trees: dict[str, TurnTree] = {}
    async with serve_worker(worker) as url, EngineClient(url) as engine:
        async with Gateway(GatewayConfig(), tok, engine, "hermes") as gw, aiohttp.ClientSession() as http:
            for rid in rollout_ids:
                handle = gw.open_session(rid)
                policy.push(f'<tool_call>\n{{"name": "bash", "arguments": {{"command": "pytest {rid}"}}}}\n</tool_call>',
                            f"The tests of {rid} pass now.", routing_key=rid)
                messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs."},
                                                  {"role": "user", "content": f"Fix the failing test of {rid}."}]
                for _ in range(2):
                    async with http.post(gw.base_url + "/v1/chat/completions", headers={
                            "Authorization": f"Bearer {handle.secret}"}, json={
                            "model": "farm-policy", "stream": False, "tools": [BASH], "messages": messages}) as r:
                        assert r.status == 200, await r.text()
                        msg = (await r.json())["choices"][0]["message"]
                    messages.append(msg)
                    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "1 passed"}
                                 for c in msg.get("tool_calls") or []]
                trees[rid] = await gw.close_session(rid)
    return trees


def build_model_run(out_dir: Path, tok: Any, model_path: str) -> Path:
    """Groups t0, t1 of N rollouts (rewards 1, 0), sessions served by the model at ``model_path``."""
    write_config(out_dir)
    specs = [Spec(f"t{g}.{i}", reward=1.0 - i) for g in range(2) for i in range(N)]

    async def run() -> None:
        trees = await _model_sessions(tok, model_path, [s.rollout_id for s in specs])
        red = ReducerActor(reducer_config(out_dir), metrics=False)
        for spec in specs:
            tree = trees[spec.rollout_id]
            await red.submit(RolloutResult(
                run_id="integ", rollout_id=spec.rollout_id, group_id=spec.task_id, task_id=spec.task_id,
                sample_index=spec.sample_index, group_index=int(spec.task_id[1:]), harness="opencode",
                model="farm-policy", status=spec.status, reward=spec.reward, grading={"resolved": spec.reward == 1.0},
                counts=counts_of(tree), sandbox_id="sb", started_at=1.0, finished_at=2.0, tree=tree,
            ))  # fmt: skip
        await red.close()

    asyncio.run(run())
    return out_dir
