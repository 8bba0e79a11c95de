"""Run a configured CLI: probe, start, supervise within the budget, kill, collect, classify.

The CLI's own command asks the gateway first (``_WRAPPER``: its probe, patiently, until
``probe_timeout_s``), then execs the CLI: one jail and one port relay for both, where a
probe of its own was another jailed command. A gateway that never answered ends the wrapper
with ``_UNREACHABLE`` and the reason on the wrapper's own stderr, which farm reads from the
command's pipe: the CLI, once exec'd, writes only to its files, so it cannot fake that end.

Supervision races three things: the CLI's exit, its budget (the sandbox kills the
whole process tree), and a watchdog that every ``watch_interval_s`` reads the tail of
the CLI's JSON stream for a retry loop and probes the gateway from inside the sandbox.
The probe (a jailed command: a bubblewrap start, its port relay, bash's HEAD) is skipped while
the gateway has served the session within the interval (``session_idle_s``): a request
that got through proves the path, and a path that dies leaves the session quiet, so the
probes resume. A local sandbox's stream is read on the host (no jailed ``tail``).
Whatever happens (also cancellation), the process tree is killed before we return.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from farm.errors import SandboxError, SandboxTimeout
from farm.harnesses.plan import HarnessEnd, HarnessHooks, HarnessResult, LaunchPlan, diff_excludes
from farm.harnesses.events import last_line, parse_json_lines, tail
from farm.harnesses.probe import probe_gateway, probe_script
from farm.sandboxes.base import BackgroundProcess, Sandbox

log = logging.getLogger(__name__)

# $4: the gateway's probe script ("" for none), tried every 0.5 s until $5 s have passed ($SECONDS
# counts whole seconds: up to one more; each attempt waits for an answer until its own timeout);
# then the CLI, stdin from the instruction file, stdout/stderr to files (partial output survives a kill)
_UNREACHABLE = 86
_UNREACHABLE_TAG = "farm: gateway unreachable: "
_WRAPPER = (
    'in=$1 out=$2 err=$3 probe=$4 patience=$5; shift 5; export FARM_LOGIN_PATH="$PATH"; '
    'if [ -n "$probe" ]; then end=$((SECONDS + patience)); '
    'until why=$(eval "$probe" 2>&1 >/dev/null); do '
    f'[ "$SECONDS" -le "$end" ] || {{ printf "{_UNREACHABLE_TAG}%s\\n" "${{why##*$\'\\n\'}}" >&2; exit {_UNREACHABLE}; }}; '
    "sleep 0.5; done; fi; "
    'exec "$@" <"$in" >"$out" 2>"$err"'
)
_STREAM_TAIL_BYTES = 256 * 1024
_KILL_GRACE_S = 30.0


class _Ended:
    """How supervision ended."""

    def __init__(self, exit_code: int | None = None, timed_out: bool = False, stuck: str | None = None,
                 stderr: str = "") -> None:
        self.exit_code, self.timed_out, self.stuck = exit_code, timed_out, stuck
        self.stderr = stderr  # the wrapper's own (the CLI's goes to its file)

    def unreachable(self) -> str | None:
        """Why the wrapper never started the CLI: the gateway did not answer its probe."""
        if self.exit_code != _UNREACHABLE:
            return None
        for line in self.stderr.splitlines():
            if line.startswith(_UNREACHABLE_TAG):
                return line[len(_UNREACHABLE_TAG):].strip() or "no answer"
        return None


async def run_plan(harness: HarnessHooks, sandbox: Sandbox, plan: LaunchPlan, *,
                   session_idle_s: Callable[[], float] | None = None) -> HarnessResult:
    cfg = harness.config
    t0 = time.monotonic()
    probe = probe_script(plan.gateway_url, cfg.probe_timeout_s) if plan.gateway_url else ""
    wrapped = ["bash", "-c", _WRAPPER, "farm-harness", plan.stdin_path, plan.stdout_path, plan.stderr_path,
               probe, str(math.ceil(cfg.probe_timeout_s)), *plan.argv]  # fmt: skip
    proc = await sandbox.start(wrapped, cwd=plan.cwd, env=plan.env)
    try:
        ended = await _supervise(harness, sandbox, plan, proc, session_idle_s)
    finally:
        await proc.kill()  # idempotent; also on cancellation
    unreachable = ended.unreachable()
    if unreachable is not None:
        return _result(
            harness, plan, t0, HarnessEnd.GATEWAY_UNREACHABLE,
            f"gateway {plan.gateway_url} unreachable from the sandbox: {unreachable}; CLI not started",
        )  # fmt: skip
    stdout = await _read_text(sandbox, plan.stdout_path)
    stderr = await _read_text(sandbox, plan.stderr_path)
    events, other = parse_json_lines(stdout)
    end, reason = _classify(harness, plan, ended, events, stderr)
    res = _result(harness, plan, t0, end, reason)
    return res.model_copy(
        update={
            "exit_code": ended.exit_code,
            "timed_out": ended.timed_out,
            "events": events,
            "non_json_lines": other,
            "final_message": harness.final_message(events),
            "stdout_tail": tail(stdout, cfg.output_tail_chars),
            "stderr_tail": tail(stderr, cfg.output_tail_chars),
            "stdout": stdout,
            "stderr": stderr,
        }
    )


async def _supervise(harness: HarnessHooks, sandbox: Sandbox, plan: LaunchPlan, proc: BackgroundProcess,
                     session_idle_s: Callable[[], float] | None) -> _Ended:
    waiter = asyncio.ensure_future(proc.wait(timeout=plan.budget_s))
    tasks: set[asyncio.Future] = {waiter}
    watcher = None
    if harness.config.watch_interval_s > 0:
        watcher = asyncio.ensure_future(_watch(harness, sandbox, plan, session_idle_s))
        tasks.add(watcher)
    try:
        done, _ = await asyncio.wait(tasks, timeout=plan.budget_s + _KILL_GRACE_S, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            try:
                res = waiter.result()
                return _Ended(exit_code=res.exit_code, stderr=res.stderr)
            except SandboxTimeout:
                return _Ended(timed_out=True)
        if watcher is not None and watcher in done:
            return _Ended(stuck=watcher.result())
        return _Ended(timed_out=True)  # the sandbox's own timeout did not fire: we kill
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _watch(harness: HarnessHooks, sandbox: Sandbox, plan: LaunchPlan,
                 session_idle_s: Callable[[], float] | None) -> str:
    """Returns (only) when the run should be stopped: why."""
    cfg = harness.config
    failed = 0
    seen, stuck = None, None
    while True:
        await asyncio.sleep(cfg.watch_interval_s)
        stream = await _tail_of(sandbox, plan.stdout_path)
        if stream != seen:  # a CLI waiting on the model writes nothing: its stream is not parsed again
            seen = stream
            events, _ = parse_json_lines(stream.split("\n", 1)[-1] if len(stream) >= _STREAM_TAIL_BYTES else stream)
            stuck = harness.retry_loop(events)
        if stuck is not None:
            return f"{harness.name} is stuck retrying model requests: {stuck}"
        if session_idle_s is not None and session_idle_s() < cfg.watch_interval_s:
            failed = 0  # the gateway served the session since the last look: the path works
            continue
        why = await probe_gateway(sandbox, plan.gateway_url, timeout_s=min(cfg.probe_timeout_s, 5.0))
        failed = failed + 1 if why is not None else 0
        if failed >= cfg.max_failed_probes:
            return f"gateway {plan.gateway_url} unreachable from the sandbox during the run ({failed} probes): {why}"


async def _tail_of(sandbox: Sandbox, path: str) -> str:
    try:
        data = await sandbox.read_tail(path, _STREAM_TAIL_BYTES)
    except (OSError, SandboxError) as exc:  # not written yet (the CLI did not start), or unreadable
        log.debug("reading %s failed: %s", path, exc)
        return ""
    return data.decode("utf-8", errors="replace")


async def _read_text(sandbox: Sandbox, path: str) -> str:
    try:
        data = await sandbox.read_file(path)
    except SandboxError:  # never created (the CLI did not start) or unreadable
        return ""
    return data.decode("utf-8", errors="replace")


def _classify(
    harness: HarnessHooks, plan: LaunchPlan, ended: _Ended, events: list[dict], stderr: str
) -> tuple[HarnessEnd, str]:
    """How the CLI ended, and why in words (the rollout's status is farm.rollout.outcome's)."""
    if ended.stuck is not None:
        return HarnessEnd.MODEL_PATH_LOST, f"{ended.stuck}; CLI killed"
    if ended.timed_out:
        why = harness.retry_loop(events)
        extra = f" (it was retrying model requests: {why})" if why else ""
        return HarnessEnd.TIMED_OUT, f"{harness.name} exceeded its {plan.budget_s:g} s budget; process tree killed{extra}"
    error = harness.stream_error(events)
    code = ended.exit_code
    if code == 0:
        if error:
            return HarnessEnd.ERROR_REPORTED, f"{harness.name} reported an error: {error}"
        return HarnessEnd.FINISHED, ""
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
    detail = error or last_line(stderr) or "no output on stderr"
    return HarnessEnd.EXITED, f"{harness.name} {how}: {detail}"


def _result(harness: HarnessHooks, plan: LaunchPlan, t0: float, end: HarnessEnd, reason: str) -> HarnessResult:
    return HarnessResult(
        harness=harness.name,
        end=end,
        reason=reason,
        duration_s=round(time.monotonic() - t0, 3),
        command=plan.shell_command(),
        files_written=plan.files_written,
        diff_excludes=diff_excludes(plan.files_written, plan.cwd),
    )
