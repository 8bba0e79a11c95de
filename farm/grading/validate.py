"""Task-set validation (SWE-bench's rule): the gold patch must resolve, the empty patch must not.

The gold patch is the task's ``gold_patch``; a task with only ``solution_commands`` gets
them run in a prepared sandbox and its diff captured (the same path an agent's work
takes). Both gradings run concurrently, each in its own fresh sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from pydantic import BaseModel, ConfigDict

from farm.errors import FarmError
from farm.grading.grader import grade, grading_spec
from farm.grading.environment import OFFLINE_P2P, missing_modules, network_note, removed_numpy_note
from farm.grading.hacks import HACK_PREFIXES, added_lines
from farm.grading.report import GradingReport
from farm.sandboxes.base import Sandbox, SandboxSpec
from farm.workspace.capture import capture_diff
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime
from farm.workspace.shell import run_step
from farm.workspace.prepare import prepare_workspace


class TaskValidation(BaseModel):
    model_config = ConfigDict(frozen=True)

    task_id: str
    kind: str
    valid: bool
    reason: str = ""
    gold: GradingReport | None = None
    empty: GradingReport | None = None
    duration_s: float = 0.0


SandboxFactory = Callable[[SandboxSpec], Awaitable[Sandbox]]
T = TypeVar("T")
log = logging.getLogger(__name__)


async def solution_diff(task: Task, *, runtime: TaskRuntime, new_sandbox: SandboxFactory, labels: Mapping[str, str]) -> str:
    """Run the task's solution commands in a prepared sandbox; their diff."""
    sandbox = await new_sandbox(await runtime.sandbox_spec(task, grading_spec(task, labels, purpose="solution")))
    try:
        ws = await prepare_workspace(sandbox, task, runtime)
        for command in task.solution_commands:
            step = await run_step(
                sandbox, command, cwd=ws.workdir, timeout=task.timeouts.test_s, env=task.env,
                path_prefix=runtime.path_prefix_for(task),
            )
            if not step.ok:
                raise FarmError(f"solution command {step.describe()}")
        captured = await capture_diff(sandbox, ws, max_bytes=runtime.config.max_diff_bytes)
        return captured.patch
    finally:
        await sandbox.close()


async def validate_task(
    task: Task, *, runtime: TaskRuntime, new_sandbox: SandboxFactory, labels: Mapping[str, str] | None = None
) -> TaskValidation:
    """Grade the gold and the empty patch; valid iff gold resolves and empty does not.
    Infrastructure errors, the system's (``OSError``) and farm's own bugs make the task invalid
    with the error as reason: a validation never raises but when cancelled."""
    t0 = time.monotonic()
    labels = dict(labels or {})
    try:
        gold = task.gold_patch
        if gold is None and task.solution_commands:
            gold = await solution_diff(task, runtime=runtime, new_sandbox=new_sandbox, labels=labels)
        if gold is None:
            return TaskValidation(task_id=task.id, kind=task.kind, valid=False, reason="no gold patch or solution commands")

        async def fresh() -> Sandbox:
            return await new_sandbox(await runtime.sandbox_spec(task, grading_spec(task, labels)))

        gold_r, empty_r = await together(
            grade(task, gold, runtime=runtime, make_sandbox=fresh),
            grade(task, "", runtime=runtime, make_sandbox=fresh),
        )
    except FarmError as exc:
        return TaskValidation(
            task_id=task.id, kind=task.kind, valid=False, reason=f"{type(exc).__name__}: {exc}",
            duration_s=time.monotonic() - t0,
        )
    except OSError as exc:  # the system's (a full disk while a workspace is packed): this row only, the run goes on
        return TaskValidation(task_id=task.id, kind=task.kind, valid=False, duration_s=time.monotonic() - t0,
                              reason=f"system error: {type(exc).__name__}: {exc} (validate it again once fixed)")
    except Exception as exc:  # noqa: BLE001 - a bug in farm or a library: said with its traceback, the run goes on
        log.exception("validating %s: internal error", task.id)
        return TaskValidation(task_id=task.id, kind=task.kind, valid=False, duration_s=time.monotonic() - t0,
                              reason=f"internal error: {type(exc).__name__}: {exc}")
    valid, reason = verdict(gold_r, empty_r)
    if not gold_r.resolved:
        reason += network_note(gold_r.test_log) + removed_numpy_note(gold_r.test_log)
    elif OFFLINE_P2P in gold_r.flags:  # valid here with fewer PASS_TO_PASS tests than the row lists
        reason = "; ".join([*([reason] if reason else []), gold_r.flag_details.get(OFFLINE_P2P, OFFLINE_P2P)])
    if not gold_r.resolved and (added := declared_dependencies(gold, missing_modules(gold_r.reason + gold_r.test_log))):
        reason += (f"; the gold patch declares {', '.join(added)} a dependency of the project: SWE-bench's evaluation "
                   "installs the checkout again after the patch, with the network, and farm grades offline in the "
                   "environment as built: add it to the recipe's base setup to grade this row here")  # fmt: skip
    defects = task.metadata.get("dataset_defects") or []
    if defects:  # the row's own ids that no run can report: left out when it loaded
        reason = "; ".join([*([reason] if reason else []), f"dataset defect, left out of its lists: {'; '.join(defects)}"])
    return TaskValidation(
        task_id=task.id, kind=task.kind, valid=valid, reason=reason, gold=gold_r, empty=empty_r,
        duration_s=time.monotonic() - t0,
    )


_DEPENDENCY_FILES = ("setup.cfg", "setup.py", "pyproject.toml", "requirements.txt")
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:[<>=!~;].*)?$")  # a line that is one


def declared_dependencies(diff: str, modules: Sequence[str]) -> list[str]:
    """Which of ``modules`` the diff adds to the project's declared dependencies (a line it adds
    to setup.cfg / setup.py / pyproject.toml / a requirements file that names it)."""
    names = {m.lower().replace("_", "-") for m in modules}
    found: list[str] = []
    for path, line in added_lines(diff):
        if path.rsplit("/", 1)[-1].endswith(_DEPENDENCY_FILES):
            requirement = _REQUIREMENT.match(line.strip().strip("\"',"))
            name = requirement.group(1).lower().replace("_", "-") if requirement else ""
            if name in names and name not in found:
                found.append(name)
    return found


def verdict(gold: GradingReport, empty: GradingReport) -> tuple[bool, str]:
    """Valid iff the gold patch resolves and the empty one does not. A hack finding on the
    gold patch that the policy only flags leaves it resolved, yet every honest patch shaped
    like it would be flagged too: it is named in the reason of a valid task."""
    reasons = []
    if not gold.resolved:
        reasons.append(f"gold patch does not resolve ({gold.status.value}: {gold.reason})")
    if empty.resolved:
        f2p = list(empty.fail_to_pass)
        named = f" (its FAIL_TO_PASS pass without the diff here: {', '.join(f2p[:3])}{', ...' if len(f2p) > 3 else ''})"
        reasons.append("the empty patch resolves" + (named if f2p else ""))
    findings = [f for f in gold.flags if f.startswith(HACK_PREFIXES)]
    if not reasons and findings:
        return True, f"valid, but the gold patch has hack findings ({gold.hack_action}): {', '.join(findings)}"
    return not reasons, "; ".join(reasons)


async def validate_tasks(
    tasks: Sequence[Task],
    *,
    runtime: TaskRuntime,
    new_sandbox: SandboxFactory,
    concurrency: int = 4,
    labels: Mapping[str, str] | None = None,
    on_result: Callable[[TaskValidation], None] | None = None,
) -> list[TaskValidation]:
    """``validate_task`` for every task, ``concurrency`` tasks at a time; results in task order."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> TaskValidation:
        async with sem:
            result = await validate_task(task, runtime=runtime, new_sandbox=new_sandbox, labels=labels)
        if on_result is not None:
            on_result(result)
        return result

    return await together(*(one(t) for t in tasks))


async def together(*steps: Awaitable[T]) -> list[T]:
    """Await every step at once; when one raises, the others are cancelled and awaited before
    the error goes on, so no step outlives its caller. A step left running would be cancelled
    by ``asyncio.run`` as it closes the loop, and one cancelled there while it spawns a
    subprocess (a host ``git clone``) never ends: CPython's subprocess transport then waits
    for pipes that its own pipe-connecting task, cancelled alongside, never connects."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
