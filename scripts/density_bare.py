"""The ceiling for ``bench_density.py --baseline bare``: the same CLIs, tasks and scripted
engine with no farm around them.

- **The engine's own endpoint.** A real SGLang serves the OpenAI protocols itself (its
  tokenizer manager renders the chat template, tokenizes, generates, detokenizes and parses
  tool calls, every request whole, keeping nothing between requests). The scripted worker
  speaks only ``/generate``, so ``serve`` runs it in one process with such a front: each
  request (Anthropic Messages, OpenAI Responses, Chat Completions: each CLI's own) parsed
  with farm's wire modules, the whole conversation rendered with the model's chat template,
  the worker asked for the reply (with the same per-turn latency), the reply written back in
  the request's protocol. No session, no history matching, no recording, no budgets, no
  fidelity check: a ``farm`` gateway's work this process does not do.
- **A rollout.** The environment's prepared tree (the snapshot a farm sandbox views)
  copied to a fresh directory; the CLI started there as its harness would start it (the
  harness's own argv, env and config files: the same flags), pointed at that endpoint, no
  jail, no cgroup limits, no watch, no gateway probe; then the task's test patch applied and
  its test command run in the same directory (no fresh sandbox, no probe, no steps' script),
  its output parsed to tell whether the rollout resolved the task.

Each rollout's CLI and test command run in accounting-only cgroups (``density_ledger``) so
their CPU is counted as the farm run's is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from density_ledger import AccountingGroup, proc_stat


# ---- the endpoint (its own process) ---------------------------------------------------------
async def serve(args: argparse.Namespace) -> None:
    from aiohttp import web

    from farm.engine.client import EngineClient, GenerateRequest
    from farm.engine.config import LatencyConfig
    from farm.errors import GatewayRequestError
    from farm.gateway.anthropic import AnthropicProtocol
    from farm.gateway.canonical import TurnOutput
    from farm.gateway.chat import ChatProtocol
    from farm.gateway.render import PromptRenderer
    from farm.gateway.responses import ResponsesProtocol
    from farm.gateway.wire import KEEPALIVE, new_id
    from farm.modeltext.tokenizer import load_tokenizer
    from farm.modeltext.toolcalls import get_format
    from farm.simulator import ScriptedWorker, WorkerSettings, serve_worker
    from farm.simulator.oracle import OraclePolicy
    from farm.simulator.tasks import load_tasks_jsonl
    from farm.trajectory.records import FinishReason

    tokenizer = load_tokenizer(args.tokenizer, None)
    tasks = load_tasks_jsonl(args.tasks_path)
    worker = ScriptedWorker(tokenizer, OraclePolicy(tasks, tool_format=args.tool_format, reads=args.reads), WorkerSettings(
        model_name=args.model_name, latency=LatencyConfig(ttft_s=args.turn_s, jitter=args.jitter)))
    renderer = PromptRenderer(tokenizer)
    fmt = get_format(args.tool_format)
    finish = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
    protocols = {"/messages": AnthropicProtocol(), "/responses": ResponsesProtocol(), "/chat/completions": ChatProtocol()}
    served = {"turns": 0}

    async with serve_worker(worker) as worker_url, EngineClient(worker_url) as engine:

        async def generate(request: web.Request) -> web.StreamResponse:
            proto = next(p for suffix, p in protocols.items() if request.path.endswith(suffix))
            try:
                req = proto.parse(json.loads(await request.read()), request.headers)
                ids = renderer.full_prompt(req.messages, req.tools, None)
            except (GatewayRequestError, ValueError) as exc:
                err = exc if isinstance(exc, GatewayRequestError) else GatewayRequestError(str(exc), status=400)
                status, body = proto.error_body(err)
                return web.json_response(body, status=status)
            ctx = proto.new_context(req, len(ids))
            if req.stream:  # headers first, as an engine's server answers a stream
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
                await resp.prepare(request)
                await resp.write(proto.stream_head(req, ctx))
                await resp.write(KEEPALIVE)
            params = {"max_new_tokens": req.max_tokens or 16384, "temperature": 1.0, "skip_special_tokens": False,
                      "no_stop_trim": True, "spaces_between_special_tokens": False}
            result = await engine.generate(GenerateRequest(input_ids=ids, sampling_params=params,
                                                           rid=uuid.uuid4().hex))
            served["turns"] += 1
            end = renderer.generated_end(result.output_ids, result.finish_type, result.matched)
            out_ids = result.output_ids[:-1] if end and isinstance(result.matched, int) else result.output_ids
            parsed = fmt.parse(renderer.decode(out_ids), in_reasoning=renderer.starts_in_reasoning, tools=req.tools,
                               make_id=lambda: new_id(proto.call_id_prefix))
            out = TurnOutput(turn_id=None, content=parsed.content, reasoning=parsed.reasoning,
                             tool_calls=tuple(parsed.tool_calls), finish=finish[result.finish_type],
                             prompt_tokens=len(ids), output_tokens=len(result.output_ids))
            if not req.stream:
                return web.json_response(proto.reply(req, ctx, out))
            await resp.write(proto.stream_rest(req, ctx, out))
            await resp.write_eof()
            return resp

        async def count_tokens(request: web.Request) -> web.Response:
            body = json.loads(await request.read())
            req = protocols["/messages"].parse({**body, "max_tokens": 1}, request.headers)
            return web.json_response({"input_tokens": len(renderer.full_prompt(req.messages, req.tools, None))})

        async def stats(request: web.Request) -> web.Response:
            return web.json_response(served)

        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="")

        app = web.Application(client_max_size=64 << 20)
        for prefix in ("/v1", ""):
            for suffix in protocols:
                app.router.add_post(prefix + suffix, generate)
            app.router.add_post(prefix + "/messages/count_tokens", count_tokens)
        app.router.add_get("/density/stats", stats)
        app.router.add_route("*", "/{tail:.*}", ok)  # HEAD /, /v1/models, ...: an empty 200
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        Path(args.ready_file).write_text(f"http://127.0.0.1:{port}")
        await asyncio.Event().wait()


async def start_endpoint(*, tokenizer: str, tasks_path: str, turn_s: float, model_name: str, work: Path,
                         tool_format: str = "hermes", reads: int = 0) -> tuple[asyncio.subprocess.Process, str]:
    ready = work / "bare-endpoint.ready"
    log = open(work / "bare-endpoint.log", "wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "serve", "--tokenizer", tokenizer, "--tasks-path", tasks_path,
        "--turn-s", str(turn_s), "--model-name", model_name, "--tool-format", tool_format,
        "--ready-file", str(ready), "--reads", str(reads), stdout=log, stderr=log, cwd=str(Path(__file__).parent))
    for _ in range(1200):
        if ready.exists() and ready.read_text():
            return proc, ready.read_text()
        if proc.returncode is not None:
            break
        await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the bare endpoint did not start: {(work / 'bare-endpoint.log').read_text()[-2000:]}")


# ---- a bare rollout -----------------------------------------------------------------------------
class BareRollouts:
    """Bare rollouts of ``tasks`` with ``harness`` against ``url``, in directories under ``work``."""

    def __init__(self, harness: Any, tasks: list[Any], trees: dict[str, Any], url: str, work: Path, *,
                 model: str, python_prefix: dict[str, str], timeout_s: float, period: float = 0.5) -> None:
        self.harness, self.tasks, self.trees, self.url, self.work = harness, tasks, trees, url, work
        self.model, self.python_prefix, self.timeout_s, self.period = model, python_prefix, timeout_s, period
        self.cpu: dict[str, float] = {"bare.cli": 0.0, "bare.tools": 0.0, "bare.test": 0.0, "bare.prep": 0.0}

    async def _run(self, argv: list[str], group: AccountingGroup, *, cwd: str, env: dict[str, str] | None = None,
                   stdin: Any = asyncio.subprocess.DEVNULL, stdout: Any = asyncio.subprocess.DEVNULL,
                   stderr: Any = asyncio.subprocess.DEVNULL, timeout: float | None = None,
                   main_cpu: list[float] | None = None) -> int:
        """Run ``argv`` in ``group``; ``main_cpu``: gets the main process's own CPU, read every
        ``period`` s while it runs."""
        proc = await asyncio.create_subprocess_exec(*group.prefix(), *argv, cwd=cwd, env=env, stdin=stdin,
                                                    stdout=stdout, stderr=stderr, start_new_session=True)
        waiter = asyncio.ensure_future(proc.wait())
        deadline = time.monotonic() + timeout if timeout else None
        while not waiter.done():
            await asyncio.wait({waiter}, timeout=self.period)
            if main_cpu is not None and not waiter.done():
                st = proc_stat(proc.pid)
                if st is not None:
                    main_cpu[0] = max(main_cpu[0], st.own_s)
            if deadline is not None and time.monotonic() > deadline and not waiter.done():
                os.killpg(proc.pid, 9)
        return waiter.result()

    async def run(self, index: int) -> dict[str, Any]:
        from farm.harnesses.base import LOGIN_PROFILE
        from farm.harnesses.plan import HarnessRun
        from farm.grading.parsers import PASSING, TestIds, log_format
        from farm.sandboxes.views import mount_view

        task = self.tasks[index % len(self.tasks)]
        view = self.trees[task.id]
        rid = uuid.uuid4().hex[:10]
        root = self.work / rid
        t0 = time.monotonic()
        timings: dict[str, float] = {}
        groups = {k: AccountingGroup(f"{rid}-{k}") for k in ("prep", "cli", "test")}
        try:
            # the workspace: the prepared tree, copied (what a farm sandbox sees through its view)
            workdir = root / "work"
            if len(view.layers) == 1:
                workdir.mkdir(parents=True)
                await self._run(["cp", "-a", "--reflink=auto", f"{view.layers[0].path}/.", f"{workdir}/"],
                                groups["prep"], cwd=str(root))
            else:  # a layered environment: farm's own copy of the layers (not counted)
                await asyncio.to_thread(mount_view, view.layers, root / "view", "copy", upper=workdir)
            scratch = root / "scratch"
            home = scratch / "home"
            run = HarnessRun(instruction=task.instruction, gateway_url=self.url, api_key="sk-bare", model=self.model,
                             workdir=str(workdir), budget_s=self.timeout_s, env={})
            files = {scratch / "instruction.txt": task.instruction, home / ".bash_profile": LOGIN_PROFILE,
                     **{Path(p): c for p, c in self.harness.config_files(run, str(scratch)).items()}}
            for path, content in files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(content)
            binary = await self.harness.install()
            path = ":".join(p for p in (self.python_prefix.get(task.id), os.environ.get("PATH", "")) if p)
            env = {"PATH": path, "HOME": str(home), "LANG": "C.UTF-8", "FARM_LOGIN_PATH": path,
                   **self.harness.environment(run, str(scratch)), **self.harness.config.extra_env}
            argv = [str(binary), *self.harness.arguments(run), *self.harness.config.extra_args]
            timings["prep"] = time.monotonic() - t0
            t1 = time.monotonic()
            cli = [0.0]
            with open(scratch / "instruction.txt", "rb") as fin, open(scratch / "stdout.jsonl", "wb") as fout, \
                    open(scratch / "stderr.txt", "wb") as ferr:
                code = await self._run(argv, groups["cli"], cwd=str(workdir), env=env, stdin=fin, stdout=fout,
                                       stderr=ferr, timeout=self.timeout_s, main_cpu=cli)
            timings["agent"] = time.monotonic() - t1
            # the tests, run directly where the agent worked: the task's test patch, its test command
            t2 = time.monotonic()
            if task.test_patch:
                (scratch / "test.patch").write_text(task.test_patch)
                await self._run(["git", "apply", "--reject", str(scratch / "test.patch")], groups["test"],
                                cwd=str(workdir))
            test_env = {**os.environ, **task.env, "PATH": path}
            with open(scratch / "test.log", "wb") as flog:
                await self._run(["bash", "-c", task.test_command or "true"], groups["test"], cwd=str(workdir),
                                env=test_env, stdout=flog, stderr=asyncio.subprocess.STDOUT,
                                timeout=task.timeouts.test_s)
            timings["test"] = time.monotonic() - t2
            text = (scratch / "test.log").read_text(errors="replace")
            statuses = log_format(task.log_parser).parse(text, None) if task.kind == "swe" else {}
            ids = TestIds(statuses, log_format(task.log_parser).ids) if task.kind == "swe" else None
            wanted = [*task.fail_to_pass, *task.pass_to_pass]
            resolved = bool(ids is not None and wanted and all(
                ids.status_of(t, "MISSING") in {p.value for p in PASSING} for t in wanted))
            cli_cmd = groups["cli"].cpu_s() or 0.0
            self.cpu["bare.cli"] += cli[0]
            self.cpu["bare.tools"] += max(0.0, cli_cmd - cli[0])
            self.cpu["bare.test"] += groups["test"].cpu_s() or 0.0
            self.cpu["bare.prep"] += groups["prep"].cpu_s() or 0.0
            why = "" if resolved else f"task {task.id}, CLI exit {code}, test log: {text[-600:]}"
            return {"exit_code": code, "resolved": resolved, "timings": timings, "why": why}
        finally:
            for g in groups.values():
                g.remove()
            await asyncio.to_thread(shutil.rmtree, root, True)


async def served_turns(url: str) -> int:
    """Model turns the bare endpoint has answered."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{url}/density/stats") as resp:
        return int((await resp.json())["turns"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the bare endpoint: the scripted worker behind its own protocol front")
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--tasks-path", required=True)
    ap.add_argument("--turn-s", type=float, default=10.0)
    ap.add_argument("--jitter", type=float, default=0.2)
    ap.add_argument("--model-name", default="farm-policy")
    ap.add_argument("--tool-format", default="hermes")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--reads", type=int, default=0, help="the oracle's extra reading turns")
    asyncio.run(serve(ap.parse_args()))
