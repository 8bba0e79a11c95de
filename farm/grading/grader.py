"""Grading in a fresh sandbox: only the model's diff crosses over from the agent's sandbox.

``grade(task, patch, runtime=..., new_sandbox=...)`` creates a sandbox, prepares the
task's workspace there exactly as for the agent (repo at base commit, setup), applies
the diff (``git apply`` -> ``--3way`` -> ``patch --fuzz``; none works: ``patch_failed``)
and then does what follows. Everything between the workspace and the test command (the
reset to the baseline, the diff, the restores, the test patch, the removals, the probe's
permissions) is ONE jailed command (``farm.grading.steps``), each step still reported
on its own: a jailed start costs ~0.05 s, seconds on a CPU-starved node.

- **SWE tasks**: resets every file the test patch touches to its baseline state (so the
  model's own edits to those tests are discarded), applies the test patch, deletes any
  stale ``test_report_file``, runs ``test_command`` (``timeouts.test_s``; outliving it
  is ``test_timeout``, reward 0), parses per-test statuses with ``log_parser`` and
  resolves iff every FAIL_TO_PASS and PASS_TO_PASS test passes (PASSED or XFAIL; a
  test missing from the output fails) and, R2E-style, every ``expected_test_statuses``
  entry matches exactly. Reward 1/0, or with ``tasks.partial_credit`` the passing
  fraction of FAIL_TO_PASS when no PASS_TO_PASS test broke.
- **generic tasks**: runs every verify command under farm's witness with
  ``$FARM_REWARD_FILE`` set, and takes the reward the verifier gave through
  ``farm_verify``, else the float a verifier wrote to the reward file, else passed/total
  (``farm.grading.reward``). Resolved iff the reward is 1.
"""

from __future__ import annotations

import math
import posixpath
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
import importlib

from farm.errors import GradingError, SandboxFileNotFound, TaskError
from farm.grading.apply import STEP_BUDGET_S, add_apply, add_restore, check_restores, patch_report
from farm.grading.baseline import baseline_key, baselines_of
from farm.grading.config import GradingConfig
from farm.grading.hacks import (HACK_PREFIXES, decide, diff_reaches, reach_key, runtime_details, runtime_flags,
                                static_flags)
from farm.grading.environment import (OFFLINE_P2P, PROBE_FAILED, diagnose, diff_brings, left_out_note,
                                      missing_modules, tried_the_network)
from farm.grading.probe import Probe, ProbeReport, add_probe_steps, probe_config, read_probe, write_probe
from farm.grading.reward import add_reward_steps, grade_generic
from farm.grading.witness import Witness
from farm.grading.steps import StepResults, StepScript
from farm.grading.rigged import static_comparison_flags
from farm.grading.parsers import PASSING, TestIds, TestStatus, fill_gaps, log_format
from farm.grading.report import MISSING, GradeStatus, GradingReport, PatchReport, unresolved_reason
from farm.grading.surface import surface_flags, surface_touches
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.workspace.capture import CapturedDiff
from farm.tasks.model import Task
from farm.tasks.patches import drop_files, is_cache_path, is_empty, touched_paths
from farm.tasks.runtime import TaskRuntime
from farm.workspace.shell import CommandReport, git_env, run_command, run_step
from farm.workspace.prepare import Workspace, prepare_workspace

SandboxMaker = Callable[[], Awaitable[Sandbox]]
_MAX_REPORT_BYTES = 64 << 20


async def grade(
    task: Task,
    patch: str | CapturedDiff,
    *,
    runtime: TaskRuntime,
    make_sandbox: SandboxMaker,
    policy: GradingConfig | None = None,
) -> GradingReport:
    """Grade ``patch`` for ``task`` in a fresh sandbox from ``make_sandbox()`` (closed after).

    ``make_sandbox`` should create the sandbox from ``grading_spec(task, labels)`` (or
    an equivalent spec: the task's image, a lifetime covering setup + tests). Returns a
    report for everything the task or the model can cause; ``SandboxError`` (the backend
    failed) and ``GradingError`` (the grader failed) propagate.
    """
    sandbox = await make_sandbox()
    try:
        return await grade_in_sandbox(sandbox, task, patch, runtime=runtime, policy=policy, baseline=make_sandbox)
    finally:
        await sandbox.close()


def grading_spec(task: Task, labels: Mapping[str, str] | None = None, purpose: str = "grading") -> SandboxSpec:
    """A SandboxSpec for grading ``task`` (its image; lifetime = workspace + setup + tests + slack)."""
    t = task.timeouts
    return SandboxSpec(
        labels={**(labels or {}), "task_id": task.id, "purpose": purpose},
        image=task.image,
        timeout_s=t.workspace_s + t.setup_s * max(1, len(task.base_setup_commands) + len(task.setup_commands))
        + 2 * t.test_s + 600,
    )


async def grade_in_sandbox(
    sandbox: Sandbox, task: Task, patch: str | CapturedDiff, *, runtime: TaskRuntime,
    policy: GradingConfig | None = None, baseline: SandboxMaker | None = None,
) -> GradingReport:
    """``grade`` in a sandbox the caller owns (it must be fresh: nothing of the agent's in it).
    ``baseline`` makes another fresh sandbox, where a run that could not reach its tests is
    tried with the empty patch (``farm.grading.environment``)."""
    policy = policy or GradingConfig()
    t0 = time.monotonic()
    text, too_large, size = (patch.patch, patch.too_large, patch.bytes) if isinstance(patch, CapturedDiff) else (patch, False, 0)
    text, caches = drop_files(text, is_cache_path)  # what tests and tools leave is not the policy's work
    base = {"task_id": task.id, "kind": task.kind}

    def done(**fields) -> GradingReport:  # noqa: ANN003 - GradingReport fields
        timings = {**fields.pop("timings", {}), "total_s": time.monotonic() - t0}
        return apply_hack_policy(GradingReport(**base, **fields, timings=timings), policy, task, text)

    try:
        ws = await prepare_workspace(sandbox, task, runtime, raise_on_setup_failure=False, make_scratch=False)
    except TaskError as exc:
        return done(status=GradeStatus.SETUP_FAILED, reason=str(exc))
    timings = {"prepare_s": time.monotonic() - t0}
    if not ws.setup.ok:
        return done(status=GradeStatus.SETUP_FAILED, reason=ws.setup.reason, setup=ws.setup, timings=timings)
    # From here on the policy's code runs: no network for it (local sandboxes; E2B: no-op).
    await sandbox.isolate_network()
    # Everything up to the test command is one jailed script (farm.grading.steps): the
    # files go in from outside, the steps run in order and stop where a step fails.
    script = StepScript(keep_bytes=4 * max(runtime.config.output_tail_chars, 2000) + 4)
    scratch = shlex.quote(ws.scratch)  # there when the script's files are (written with their parents): no mkdir
    script.add("scratch", f"[ -d {scratch} ] || mkdir -p -- {scratch}", then="|| exit 0")
    if ws.baseline_commit != ws.base_commit:
        # Grading layout: HEAD = index = work tree = the post-setup snapshot.
        script.add("reset", f"git reset -q {shlex.quote(ws.baseline_commit)}", budget_s=STEP_BUDGET_S, then="|| exit 0")
    touches = surface_touches(text, test_patch=task.test_patch, patterns=task.test_surface)
    probe = None
    if not too_large:
        add_apply(script, "model", text, scratch=ws.scratch)
        # The test surface is the task's: put back what the diff changed there (added files go).
        add_restore(script, "surface", [t.path for t in touches], scratch=ws.scratch)
        probe = await _add_task_steps(script, sandbox, task, ws, policy)
    t1 = time.monotonic()
    steps = await script.run(sandbox, cwd=ws.workdir, env=git_env())
    timings["steps_s"] = time.monotonic() - t1
    made = steps.require("scratch")
    if not made.ok:
        return done(status=GradeStatus.SETUP_FAILED, reason=f"cannot create {ws.scratch}: {made.stderr.strip()}",
                    setup=ws.setup, timings=timings)  # fmt: skip
    reset = steps.get("reset")
    if reset is not None and not reset.ok:
        return done(status=GradeStatus.ERROR, reason=f"cannot reset to the baseline: {reset.stderr.strip()}", setup=ws.setup)
    if too_large:
        reason = f"the diff is {size} bytes, over tasks.max_diff_bytes"
        return done(status=GradeStatus.PATCH_FAILED, reason=reason, setup=ws.setup, timings=timings)
    applied = patch_report(steps, "model", text, tail_chars=runtime.config.output_tail_chars)
    applied = applied.model_copy(update={"ignored": caches})
    timings["apply_s"] = sum(a.duration_s for a in applied.attempts)
    if applied.strategy is None:
        last = applied.attempts[-1] if applied.attempts else None
        why = (last.stderr_tail or last.stdout_tail).strip()[-300:] if last else ""
        reason = f"the diff does not apply (git apply, --3way, patch --fuzz): {why}"
        return done(status=GradeStatus.PATCH_FAILED, reason=reason, patch=applied, setup=ws.setup, timings=timings)
    surface = {t.path for t in touches}
    flags = surface_flags(touches) + static_flags(text, surface)
    # Read after the whole script: the later steps touch only the test surface, which this skips.
    flags += await static_comparison_flags(sandbox, ws.workdir, text, surface)
    common = {
        "patch": applied, "setup": ws.setup, "timings": timings,
        "test_surface": {t.path: f"{t.action}: {t.why}" for t in touches}, "flags": flags,
    }  # fmt: skip
    check_restores(steps, "surface")
    if task.kind == "swe":
        view = sandbox.view
        attempt = Attempt(text, surface, baseline, view.key if view is not None else None)
        return done(**await _grade_swe(sandbox, task, ws, runtime, common, policy, attempt, steps,
                                       probe if isinstance(probe, Probe) else None))
    assert isinstance(probe, Witness)  # generic tasks: the verifiers' witness
    return done(**await grade_generic(sandbox, task, ws, runtime, common, probe, _read_optional))


async def _add_task_steps(script: StepScript, sandbox: Sandbox, task: Task, ws: Workspace,
                          policy: GradingConfig) -> Probe | Witness | None:  # fmt: skip
    """The steps after the diff and the surface restore, before the task's own commands:
    SWE: the test patch, a stale report removed, the probe;
    generic: the verifiers' witness, the reward file removed (``farm.grading.reward``)."""
    if task.kind != "swe":
        return await add_reward_steps(script, sandbox, task, ws)
    if task.test_patch:
        # No restore of the test patch's files first (SWE-bench's harness checks them out):
        # in a fresh sandbox only the diff changed them, and every one it touched is a surface
        # file the "surface" restore has put back (``surface_touches``: "test patch file").
        add_apply(script, "test", task.test_patch, scratch=ws.scratch)
    if task.test_report_file:  # (rm is a process: run only when a report is there)
        report = shlex.quote(posixpath.join(ws.workdir, task.test_report_file))
        script.add("report.remove", f"if [ -e {report} ] || [ -L {report} ]; then rm -f -- {report}; fi")
    if not policy.probe:
        return None
    tests = [*task.fail_to_pass, *task.pass_to_pass, *task.expected_test_statuses]
    probe = await write_probe(sandbox, probe_config(ws.workdir, tests, touched_paths(task.test_patch or "")))
    add_probe_steps(script, probe, ws.workdir)
    return probe


@dataclass(frozen=True)
class Attempt:
    """What the SWE grading needs of the diff itself: its text, the test-surface files it
    touched, and where a baseline run (the empty patch) can be had."""

    diff: str
    surface: set[str]
    baseline: SandboxMaker | None
    environment: str | None = None  # the grading sandbox's snapshot (its content key): where a baseline is shared


# SWE-bench's eval scripts print these around the test command's output (its harness reads only that part)
START_TEST_OUTPUT, END_TEST_OUTPUT = ">>>>> Start Test Output", ">>>>> End Test Output"


def between_test_markers(log: str) -> str:
    """The part of a test run's log its parser reads: between SWE-bench's markers when the log
    has them (an eval script also prints the diff it applies, which may hold test-like lines)."""
    start = log.find(START_TEST_OUTPUT)
    end = log.rfind(END_TEST_OUTPUT)
    if start < 0 or end < start:
        return log
    start = log.find("\n", start)
    end = log.rfind("\n", 0, end)
    return log[start + 1 : end + 1] if 0 <= start < end else ""


async def _grade_swe(sandbox: Sandbox, task: Task, ws: Workspace, runtime: TaskRuntime, common: dict,
                     policy: GradingConfig, attempt: Attempt, steps: StepResults, probe: Probe | None) -> dict:
    cfg = runtime.config
    if task.test_patch:
        tp: PatchReport = patch_report(steps, "test", task.test_patch)
        if tp.strategy is None:
            why = tp.attempts[-1].stderr_tail.strip()[-300:] if tp.attempts else ""
            return {**common, "status": GradeStatus.ERROR, "reason": f"the task's test patch does not apply: {why}"}
    try:
        fmt = log_format(task.log_parser)
    except KeyError as exc:
        return {**common, "status": GradeStatus.ERROR, "reason": str(exc.args[0])}
    report_path = posixpath.join(ws.workdir, task.test_report_file) if task.test_report_file else None
    assert task.test_command is not None  # Task validation guarantees it for SWE tasks
    t0 = time.monotonic()
    test, res = await run_command(
        sandbox, probe.command(task.test_command) if probe else task.test_command, cwd=ws.workdir,
        timeout=task.timeouts.test_s, env=probe.env(dict(task.env)) if probe else task.env,
        path_prefix=runtime.path_prefix_for(task), tail_chars=cfg.output_tail_chars, label=task.test_command,
    )  # fmt: skip
    common["timings"]["test_s"] = time.monotonic() - t0
    fields = {**common, "test": test, "log_parser": task.log_parser}
    if res is None:
        reason = f"the test command exceeded {task.timeouts.test_s:g} s"
        return {**fields, "status": GradeStatus.TEST_TIMEOUT, "reason": reason}
    fields["test_log"] = res.stdout + ("\n" + res.stderr if res.stderr else "")
    report_text = await _read_optional(sandbox, report_path)
    printed = fmt.parse(between_test_markers(res.stdout + "\n" + res.stderr), report_text)
    statuses = printed
    seen = None
    pytest_task = fmt.pytest
    if probe is not None:
        if PROBE_FAILED.search(fields["test_log"]):
            raise GradingError(f"farm's probe cannot load in the task's environment: {fields['test_log'][-500:]}")
        seen = read_probe(await _read_optional(sandbox, probe.report_path), probe.key)
        if pytest_task and seen.finished and not seen.forged_lines:
            statuses = fill_gaps(seen.statuses, printed)  # farm's channel decides; printed only fills gaps
    ids = TestIds(statuses, fmt.ids)  # the exact ids behind the listed ones (SWE-bench's may be cut)
    f2p = {t: ids.status_of(t, MISSING) for t in task.fail_to_pass}
    p2p = {t: ids.status_of(t, MISSING) for t in task.pass_to_pass}
    watched = [*f2p.values(), *p2p.values()]
    reached = any(s != MISSING for s in watched) if watched else bool(statuses)
    broken = await _environment_failure(sandbox, task, ws, runtime, policy, attempt, res.exit_code, fields["test_log"],
                                        seen, reached=reached)  # fmt: skip
    if broken:
        reason = broken + left_out_note(fields["test_log"], ws.setup.left_out)
        return {**fields, "status": GradeStatus.ENV_BROKEN, "reason": reason, "tests": statuses}
    if seen is not None:
        code_paths = set(touched_paths(attempt.diff)) - attempt.surface
        found = runtime_flags(
            seen, pytest_task=pytest_task, watched=ids.members([*task.fail_to_pass, *task.pass_to_pass]),
            printed={k: v.value for k, v in printed.items()}, f2p=ids.members(task.fail_to_pass),
            exit_code=res.exit_code, code_paths=code_paths, workdir=ws.workdir)  # fmt: skip
        fields["probe_reaches"] = sorted({reach_key(r, ws.workdir) for r in seen.reaches})
        if "runtime:runner_tampered" in found and await _reaches_without_the_diff(task, runtime, policy, attempt,
                                                                                 diff_reaches(seen, code_paths, ws.workdir)):  # fmt: skip
            found = [f for f in found if f != "runtime:runner_tampered"]
        fields["flags"] = sorted({*fields["flags"], *found})
        fields["flag_details"] = runtime_details(seen, found, code_paths=code_paths, workdir=ws.workdir)
    mismatches: dict[str, list[str]] = {}
    if task.expected_test_statuses:
        for name in sorted(set(task.expected_test_statuses) | set(statuses)):
            want = task.expected_test_statuses.get(name, MISSING)
            got = statuses[name].value if name in statuses else MISSING
            if want != got:
                mismatches[name] = [want, got]
    ok = lambda s: s in {p.value for p in PASSING}  # noqa: E731
    f2p_ok = sum(ok(s) for s in f2p.values())
    if offline := await _offline_p2p(task, runtime, policy, attempt, p2p, fields["test_log"]):
        fields["flags"] = sorted({*fields["flags"], OFFLINE_P2P})
        fields["flag_details"] = {**fields.get("flag_details", {}), OFFLINE_P2P: (
            f"{len(offline)} PASS_TO_PASS test(s) reach hosts on the internet and fail the same without the diff "
            f"(a grading sandbox has no network): not judged here: {', '.join(offline[:5])}")}  # fmt: skip
    judged = {t: s for t, s in p2p.items() if t not in offline}
    p2p_all = all(ok(s) or s == TestStatus.SKIPPED.value for s in judged.values())  # SWE-bench: P2P may skip
    listed = bool(f2p or p2p or task.expected_test_statuses)
    resolved = (f2p_ok == len(f2p) and p2p_all and not mismatches) if listed else res.exit_code == 0
    reward = 1.0 if resolved else 0.0
    if not resolved and cfg.partial_credit and p2p_all:
        if f2p:
            reward = f2p_ok / len(f2p)
        elif task.expected_test_statuses:
            reward = 1.0 - len(mismatches) / max(1, len(set(task.expected_test_statuses) | set(statuses)))
    reason = "" if resolved else unresolved_reason(f2p, judged, mismatches, res.exit_code, listed, ids) + left_out_note(
        fields["test_log"], ws.setup.left_out)
    return {
        **fields,
        "status": GradeStatus.RESOLVED if resolved else GradeStatus.UNRESOLVED,
        "resolved": resolved,
        "reward": reward,
        "reason": reason,
        "tests": statuses,
        "fail_to_pass": f2p,
        "pass_to_pass": p2p,
        "expected_mismatches": mismatches,
    }


async def _environment_failure(sandbox: Sandbox, task: Task, ws: Workspace, runtime: TaskRuntime,
                               policy: GradingConfig, attempt: Attempt, exit_code: int, log: str,
                               seen: ProbeReport | None, *, reached: bool) -> str | None:  # fmt: skip
    """The reason this run is an environment failure (``farm.grading.environment``), or None."""
    if reached:
        return None
    text = "\n".join([log, *(seen.collect_errors.values() if seen else ())])
    names: list[str] = []
    if missing_modules(text):
        listing = await sandbox.exec(["sh", "-c", "ls -1A; ls -1A src lib 2>/dev/null"], cwd=ws.workdir, timeout=60)
        provided = [*touched_paths(task.gold_patch or ""), *touched_paths(task.test_patch or "")]
        names = [n.removesuffix(".py") for n in [*listing.stdout.split(), *(p.split("/")[0] for p in provided)]]
    cause = diagnose(exit_code=exit_code, text=text, repo_names=names)
    if cause is None:
        return None
    why = f"the environment cannot run the task's tests: {cause}"
    if is_empty(attempt.diff):
        return why
    if attempt.baseline is None:  # no fresh sandbox to try without the diff: read the diff instead
        return None if diff_brings(attempt.diff, cause) else why
    empty = await _baseline(task, runtime, policy, attempt)
    return f"{why} (the same without the diff)" if empty.status is GradeStatus.ENV_BROKEN else None


async def _offline_p2p(task: Task, runtime: TaskRuntime, policy: GradingConfig, attempt: Attempt,
                       p2p: dict[str, str], log: str) -> list[str]:  # fmt: skip
    """The PASS_TO_PASS tests this machine cannot judge: the run shows its tests failing to reach
    hosts (SWE-bench's harness ran them online; a grading sandbox has no network) and these fail
    without the diff too, in a fresh sandbox. A diff never excuses a test it breaks itself: a
    test that passes without the diff is judged, whatever its failure prints."""
    bad = [t for t, s in p2p.items() if s in (TestStatus.FAILED.value, TestStatus.ERROR.value)]
    if not bad or not tried_the_network(log):
        return []
    if is_empty(attempt.diff):
        return bad
    if attempt.baseline is None:
        return []
    empty = await _baseline(task, runtime, policy, attempt)
    if empty.status not in (GradeStatus.RESOLVED, GradeStatus.UNRESOLVED):
        return []
    failing = (TestStatus.FAILED.value, TestStatus.ERROR.value)
    return [t for t in bad if empty.pass_to_pass.get(t) in failing]


async def _reaches_without_the_diff(task: Task, runtime: TaskRuntime, policy: GradingConfig, attempt: Attempt,
                                    mine: set[str] | None) -> bool:  # fmt: skip
    """Does the run without the diff reach for the runner exactly as the diff's files did (the
    same event from the same function of the same file)? Then it is the project's own doing
    (sqlfluff's ``--profiler`` starts cProfile from the CLI module a fix edits), not the diff's."""
    if not mine or is_empty(attempt.diff) or attempt.baseline is None:
        return False
    empty = await _baseline(task, runtime, policy, attempt)
    return empty.status in (GradeStatus.RESOLVED, GradeStatus.UNRESOLVED) and mine <= set(empty.probe_reaches)


async def _baseline(task: Task, runtime: TaskRuntime, policy: GradingConfig, attempt: Attempt) -> GradingReport:
    """The empty patch's grade, once per task and environment (``farm.grading.baseline``)."""
    assert attempt.baseline is not None
    maker = attempt.baseline
    key = baseline_key(task, attempt.environment, policy)
    return await baselines_of(runtime).get(key, lambda: grade(task, "", runtime=runtime, make_sandbox=maker, policy=policy))


async def _read_optional(sandbox: Sandbox, path: str | None) -> str | None:
    if path is None:
        return None
    try:
        data = await sandbox.read_file(path)
    except SandboxFileNotFound:
        return None
    return data[:_MAX_REPORT_BYTES].decode("utf-8", errors="replace")


def apply_hack_policy(report: GradingReport, policy: GradingConfig, task: Task, diff: str) -> GradingReport:
    """Run the optional judge, then let the findings act on the reward (``farm.grading.hacks``)."""
    flags = list(report.flags)
    if policy.judge and report.status in (GradeStatus.RESOLVED, GradeStatus.UNRESOLVED):
        finding = run_judge(policy.judge, task, diff, report)
        if finding:
            flags.append(f"judge:{finding}")
    action = decide(flags, on_hack=policy.on_hack, on_static_hack=policy.on_static_hack)
    update: dict = {"flags": flags, "hack_action": action}
    if action in ("zero_reward", "exclude") and report.reward > 0:
        hacks = [f for f in flags if f.startswith(HACK_PREFIXES)]
        update.update(reward=0.0, resolved=False, status=GradeStatus.UNRESOLVED, reward_before_hack_policy=report.reward,
                      reason=f"reward hack ({action}): {', '.join(hacks)}")  # fmt: skip
    return report.model_copy(update=update)


def run_judge(spec: str, task: Task, diff: str, report: GradingReport) -> str | None:
    """Call ``module:callable`` (task, diff, report) -> None or a short finding."""
    module, _, name = spec.partition(":")
    try:
        verdict = getattr(importlib.import_module(module), name)(task, diff, report)
    except Exception as exc:  # the judge is farm's infrastructure: its failure is never the policy's
        raise GradingError(f"grading.judge {spec!r} failed: {exc!r}") from exc
    return None if not verdict else re.sub(r"[^A-Za-z0-9_.-]+", "_", str(verdict))[:60]
