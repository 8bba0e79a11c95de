"""``farm engine serve``: run one scripted SGLang-protocol worker.

    farm engine serve --policy oracle|noop|replay|scripted|shell|choose --tokenizer PATH|builtin:farm-test \\
        [--tasks TASKS.jsonl] [--host H] --port N [--seed S] [--tool-format hermes|qwen3_coder] \\
        [--ttft S --tokens-per-s N --jitter F] [--error-rate F --hang-rate F --drop-rate F] \\
        [--record OUT.jsonl] [--replay REC.jsonl] [--replies REPLIES.jsonl] [--ready-file PATH] \\
        [--model CHECKPOINT_DIR [--torch-threads N]]

Point any SGLang client, or the real router (``--worker-urls http://H:N``), at it.
``--model`` puts farm's tiny CPU language model (``farm.simulator.lm``, a test double for
a GPU model) behind the policy: it samples the policy's choices and scores every token.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="engine_command", required=True)
    p = sub.add_parser("serve", help="run a scripted worker (SGLang /generate protocol)")
    p.add_argument("--policy", choices=["oracle", "noop", "replay", "scripted", "shell", "loop", "ramble", "choose"],
                   default="oracle")
    p.add_argument("--tokenizer", default="builtin:farm-test", help="HF tokenizer dir/name or builtin:farm-test")
    p.add_argument("--tokenizer-cache-dir", default=None, help="where builtin tokenizers are built")
    p.add_argument("--tasks", default=None, help="JSONL of farm Tasks (oracle)")
    p.add_argument("--replay", default=None, help="recorded outputs (replay)")
    p.add_argument("--replies", default=None, help="JSONL replies (scripted)")
    p.add_argument("--record", default=None, help="append finished responses here (replay format)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True, help="0 = any free port (see --ready-file)")
    p.add_argument("--ready-file", default=None, help="write the base URL here once listening")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--oracle-reads", type=int, default=0, metavar="N",
                   help="oracle: N more model turns of reading before the fix (a real agent's rollout length)")
    p.add_argument("--tool-format", choices=["hermes", "qwen3_coder"], default="hermes")
    p.add_argument("--model-name", default="farm-policy")
    p.add_argument("--worker-id", default="scripted-0")
    p.add_argument("--stream-interval", type=int, default=1)
    p.add_argument("--context-length", type=int, default=131072)
    p.add_argument("--ttft", type=float, default=0.0, help="time to first token, seconds")
    p.add_argument("--tokens-per-s", type=float, default=0.0, help="0 = as fast as possible")
    p.add_argument("--jitter", type=float, default=0.0)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--hang-rate", type=float, default=0.0)
    p.add_argument("--drop-rate", type=float, default=0.0)
    p.add_argument("--hang-s", type=float, default=3600.0)
    p.add_argument("--model", default=None, metavar="CHECKPOINT_DIR",
                   help="farm tiny-LM checkpoint (farm.simulator.lm.save_model): sample choices and score every token")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of the model (--model)")
    p.add_argument("--moe", default=None, metavar="LAYERS,TOP_K,EXPERTS",
                   help="simulate a MoE model: return routed experts when a request asks for them")


def run(args: argparse.Namespace) -> int:
    # asyncio only when the command runs (the CLI's start-up)
    import asyncio

    # heavy: numpy, pydantic, aiohttp
    from farm.engine.config import FaultConfig, LatencyConfig
    from farm.simulator.run import build_worker, serve_until_signal
    from farm.simulator.server import WorkerSettings

    settings = WorkerSettings(
        worker_id=args.worker_id,
        model_name=args.model_name,
        seed=args.seed,
        stream_interval=args.stream_interval,
        context_length=args.context_length,
        latency=LatencyConfig(ttft_s=args.ttft, tokens_per_s=args.tokens_per_s, jitter=args.jitter),
        faults=FaultConfig(error_rate=args.error_rate, hang_rate=args.hang_rate, drop_rate=args.drop_rate,
                           hang_s=args.hang_s),
        record_path=args.record,
        moe=_moe(args.moe),
    )
    scorer = None
    try:
        if args.model:
            # heavy: torch (the CPU model), only with --model
            from farm.simulator.lm import LMScorer

            scorer = LMScorer.from_path(args.model, threads=args.torch_threads)
        worker = build_worker(
            policy=args.policy, tokenizer=args.tokenizer, settings=settings,
            tokenizer_cache_dir=args.tokenizer_cache_dir, tasks_path=args.tasks, replay_path=args.replay,
            replies_path=args.replies, tool_format=args.tool_format, scorer=scorer, oracle_reads=args.oracle_reads,
        )
    except ValueError as exc:  # an unusable model or policy input: say which, do not serve
        print(f"farm engine serve: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve_until_signal(worker, args.host, args.port, args.ready_file))
    return 0


def _moe(spec: str | None):
    if not spec:
        return None
    # heavy: numpy, pydantic
    from farm.engine.routing import MoEShape

    layers, top_k, experts = (int(x) for x in spec.split(","))
    return MoEShape(layers=layers, top_k=top_k, experts=experts)
