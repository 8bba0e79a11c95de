"""Builders shared by the farm tests (imported as a module: tests/farm is on sys.path via rootdir)."""

from __future__ import annotations

from farm.config import FarmConfig
from farm.rollout.model import RolloutResult
from farm.output.rows import counts_of
from farm.status import RolloutStatus
from farm.trajectory.tree import TurnTree


def make_tree(session_id: str, turns: int = 2, base: int = 10, version: int | None = None) -> TurnTree:
    tree = TurnTree(session_id)
    parent = None
    for k in range(turns):
        prompt = [base + k, base + k + 1, base + k + 2] if parent is None else [7, 8]
        out = [100 + k, 101 + k]
        rec = tree.append(parent_id=parent, prompt_delta_ids=prompt, output_ids=out,
                          output_logprobs=[-0.5, -0.25], finish_reason="stop", policy_version=version)
        parent = rec.turn_id
    return tree


def make_result(rid: str, *, status=RolloutStatus.COMPLETED, reward: float = 1.0, turns: int = 2,
                run_id: str = "t") -> RolloutResult:
    tree = make_tree(rid, turns) if turns else None
    return RolloutResult(
        run_id=run_id, rollout_id=rid, group_id=rid.rsplit(".", 1)[0], task_id=rid.rsplit(".", 1)[0],
        sample_index=int(rid.rsplit(".", 1)[1]), harness="claude_code", model="farm-policy",
        status=status, reason="" if status is RolloutStatus.COMPLETED else "because",
        reward=reward, grading={"resolved": reward == 1.0, "tests": ["a", "b"]}, diff="diff --git a/x b/x\n",
        agent_log_tail='{"type":"result"}', counts=counts_of(tree), timings={"agent": 1.5, "total": 2.0},
        sandbox_id="sb-" + rid, started_at=100.0, finished_at=102.0, tree=tree,
    )


def reducer_config(out_dir, **output) -> FarmConfig:
    """A reducer's config for the tests of what it writes: an infrastructure failure it is
    handed is recorded (no infrastructure reruns: the reducer decides retries, and these tests
    hand it rows of every status to write)."""
    return FarmConfig.model_validate({"run_id": "t", "output": {"dir": str(out_dir), **output},
                                      "ray": {"reducer_flush_s": 0.05}, "rollout": {"infra_retries": 0}})


class FakeParts:
    """Rollout parts with real LocalSandboxes and real processes but no gateway/engine/CLI.

    Per task (``task.metadata``): ``agent_s`` (how long the 'agent' runs), ``reward``,
    ``exit`` (agent exit code). Every started rollout appends its id to
    ``<metadata['log_dir']>/started``.
    """

    def __init__(self, cfg, engine_url, *, secrets=None, on_sandbox_created=None):
        self.cfg = cfg
        self.sessions: set[str] = set()

    async def start(self) -> str:
        """No gateway runs: the URL it would be reached at (gateway.public_url as its actor
        filled it, a fixed port), else a fake one."""
        from farm.gateway.public_url import public_url

        return public_url(self.cfg.gateway.public_url, 8700) or "http://fake-gateway"

    async def stop(self) -> None:
        return None

    async def create_sandbox(self, spec, purpose):
        from farm.sandboxes.base import SandboxSpec
        from farm.sandboxes.factory import create_sandbox

        labels = {"run_id": spec.run_id, "rollout_id": spec.rollout_id, "purpose": purpose}
        return await create_sandbox(self.cfg.sandbox, SandboxSpec(labels=labels))

    async def prepare(self, sb, spec):
        log_dir = spec.task.metadata.get("log_dir")
        if log_dir:
            with open(f"{log_dir}/started", "a") as fh:
                fh.write(f"{spec.rollout_id} {spec.attempt}\n")

    async def open_session(self, spec):
        self.sessions.add(spec.rollout_id)
        self.versions = {**getattr(self, "versions", {}), spec.rollout_id: spec.task.metadata.get("version")}
        return spec.rollout_id

    async def run_agent(self, sb, spec, secret, budget_s, workspace):
        from farm.errors import SandboxTimeout
        from farm.rollout.pipeline import AgentEnd

        md = spec.task.metadata
        if md.get("crash_actor") and spec.attempt <= md.get("crash_actor_attempts", spec.attempt):
            import os

            os._exit(1)  # the actor process dies under the rollout
        if spec.attempt <= md.get("infra_fail_attempts", 0):
            from farm.errors import SandboxError

            raise SandboxError(f"injected sandbox failure (attempt {spec.attempt})")
        proc = await sb.start(f"sleep {md.get('agent_s', 0.1)}; exit {md.get('exit', 0)}")
        try:
            res = await proc.wait(timeout=budget_s)
        except SandboxTimeout:
            return AgentEnd(exit_code=None, timed_out=True)
        return AgentEnd(exit_code=res.exit_code, stderr_tail=res.stderr, log_tail="agent log")

    async def capture(self, sb, spec, workspace):
        return "diff --git a/x b/x\n"

    async def close_session(self, secret):
        self.sessions.discard(secret)
        return make_tree(secret, 2, version=getattr(self, "versions", {}).get(secret))

    async def grade(self, spec, diff):
        from farm.rollout.pipeline import Grade

        reward = float(spec.task.metadata.get("reward", 1.0))
        return Grade(reward=reward, report={"resolved": reward == 1.0})


class MeteredParts(FakeParts):
    """FakeParts whose sessions look like a gateway's: every turn has the gateway's timings,
    and per task (``task.metadata``) ``flags`` (turn flags of the last turn), ``engine_error``
    (the last turn failed in the engine) and ``truncate`` (a turn budget ran out: the rollout
    is truncated). It also reports sandbox create times, as the real parts do."""

    def __init__(self, cfg, engine_url, *, secrets=None, on_sandbox_created=None):
        super().__init__(cfg, engine_url)
        self.on_sandbox_created = on_sandbox_created
        self.tasks = {}

    async def create_sandbox(self, spec, purpose):
        import time

        t0 = time.monotonic()
        sb = await super().create_sandbox(spec, purpose)
        if self.on_sandbox_created is not None:
            self.on_sandbox_created(time.monotonic() - t0)
        return sb

    async def open_session(self, spec):
        self.tasks[spec.rollout_id] = spec.task.metadata
        return await super().open_session(spec)

    async def close_session(self, secret):
        from farm.trajectory.records import Budget, BudgetStop, FinishReason

        self.sessions.discard(secret)
        md = self.tasks.pop(secret, {})
        tree, parent = TurnTree(secret), None
        for k in range(2):
            last = k == 1
            rec = tree.append(
                parent_id=parent, prompt_delta_ids=[10 + k, 11, 12] if parent is None else [7, 8],
                output_ids=[100 + k, 101], output_logprobs=[-0.5, -0.25],
                finish_reason=FinishReason.ERROR if last and md.get("engine_error") else "stop",
                flags=md.get("flags", ()) if last else (), policy_version=md.get("version"),
                timings={"engine_ms": 20.0 + 30 * k, "plan_ms": 0.4, "render_ms": 1.5, "parse_ms": 0.3, "record_ms": 0.2},
            )  # fmt: skip
            parent = rec.turn_id
        if md.get("truncate"):
            tree.budget_stop = BudgetStop(Budget.MAX_TURNS, 2, 2)
        return tree
