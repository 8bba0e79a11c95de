"""A generic task's reward: its verify commands, each under farm's witness, and a reward
channel the workspace's code cannot write.

``$FARM_REWARD_FILE`` is set for every verify command of a generic task: the row's
``reward_file`` (relative to the workdir, or absolute) when it has one, else a fresh path
outside the workspace; it is deleted before the first verify command. When the sandbox
has ``python3``, each verify command runs under the witness (``farm.grading.witness``,
``inside/farm_witness.py``: a new key per command) with ``$FARM_WITNESS`` set and the
directory of ``farm_verify`` (``inside/farm_verify.py``) first on ``PYTHONPATH``; a verifier
that imports ``farm_verify`` gives its reward over the witness's channel and runs the
workspace's code out of process (``call``, ``call_many``, ``run``).

The reward, in order:

- a reward the verifier gave through ``farm_verify.reward`` (the witness writes it to the
  reward file too);
- else the float a verifier wrote to the reward file;
- else passed / total verify commands.

Findings (``runtime:``, which zero the reward by default): ``reward_forged`` (a reward
from any connection but the verifier's, a line off its chain, a witness report that does
not verify), ``reward_written_twice`` (more than one reward given, or, for a verifier
that writes the file itself, the file written more than once: the honest score, then an
exit handler's 1.0), ``reward_file_rewritten`` (the file written by anyone but the witness
after the verifier gave its reward through the channel, or left holding another value).
"""

from __future__ import annotations

import math
import posixpath
import shlex
import time

from farm.grading.report import GradeStatus
from farm.grading.steps import StepScript
from farm.grading.witness import Witness, WitnessRecord, inside_source, install_witness, read_witness, rekey
from farm.sandboxes.base import Sandbox
from farm.tasks.model import Task
from farm.tasks.runtime import TaskRuntime
from farm.workspace.prepare import Workspace
from farm.workspace.shell import CommandReport, run_command

HELPER = "farm_verify.py"
DEFAULT_NAME = "reward"  # in the witness's directory, when the row names no reward_file


def reward_path(task: Task, workdir: str) -> str | None:
    """The row's own reward file, absolute (None: the row names none)."""
    if not task.reward_file:
        return None
    return task.reward_file if posixpath.isabs(task.reward_file) else posixpath.join(workdir, task.reward_file)


async def add_reward_steps(script: StepScript, sandbox: Sandbox, task: Task, ws: Workspace) -> Witness:
    """The witness and the verifier's helper installed (from outside), the reward file
    removed (the model's diff may have brought one) and the directory opened to the
    verifier's user: steps of the grader's script, before any verify command."""
    witness = await install_witness(sandbox, {HELPER: inside_source(HELPER)}, purpose="verify")
    path = reward_path(task, ws.workdir)
    if path is not None:
        script.add("reward.remove", f"rm -f -- {shlex.quote(path)}")
    script.add("verify.chmod", f"chmod -R a+rwX {shlex.quote(witness.directory)}")
    return witness


async def grade_generic(sandbox: Sandbox, task: Task, ws: Workspace, runtime: TaskRuntime, common: dict,
                        witness: Witness, read_optional) -> dict:  # noqa: ANN001 - the grader's file reader
    if not task.verify_commands:
        return {**common, "status": GradeStatus.ERROR, "reason": "the task has no verify commands"}
    path = reward_path(task, ws.workdir) or f"{witness.directory}/{DEFAULT_NAME}"
    env = {**task.env, "FARM_REWARD_FILE": path}
    env["PYTHONPATH"] = ":".join(x for x in (witness.directory, task.env.get("PYTHONPATH", "")) if x)
    t0 = time.monotonic()
    verify: list[CommandReport] = []
    records: list[WitnessRecord] = []
    for i, command in enumerate(task.verify_commands):
        if i:
            witness = await rekey(sandbox, witness)
        report, _ = await run_command(
            sandbox, witness.command(command, watch=path), cwd=ws.workdir, timeout=task.timeouts.test_s, env=env,
            path_prefix=runtime.path_prefix_for(task), tail_chars=runtime.config.output_tail_chars, label=command,
        )  # fmt: skip
        verify.append(report)
        records.append(read_witness(await read_optional(sandbox, witness.report_path), witness.key))
    common["timings"]["test_s"] = time.monotonic() - t0
    given, flags = channel_rewards(records)
    text = await read_optional(sandbox, path)
    in_file, note = _float(text)
    if given and in_file != given[-1]:
        flags.add("runtime:reward_file_rewritten")  # written after the verifier's reward, by someone else
    value = given[-1] if given else in_file
    passed = sum(c.ok for c in verify)
    reward = value if value is not None else passed / len(verify)
    resolved = reward >= 1.0 - 1e-9
    reason = "" if given else note
    if not resolved and not reason:
        failing = next((c for c in verify if not c.ok), None)
        reason = f"reward {reward:g}" + (f"; {failing.describe()}" if failing else "")
    return {
        **common,
        "status": GradeStatus.RESOLVED if resolved else GradeStatus.UNRESOLVED,
        "resolved": resolved,
        "reward": reward,
        "reason": reason,
        "verify": verify,
        "reward_file_value": value,
        "flags": sorted({*common.get("flags", []), *flags}),
        "flag_details": {f: _DETAILS[f] for f in flags if f in _DETAILS},
    }


_DETAILS = {
    "runtime:reward_forged": "a reward from a connection that is not the verifier's, or a report the witness "
    "did not sign",
    "runtime:reward_written_twice": "more than one reward given, or the reward file written more than once",
    "runtime:reward_file_rewritten": "the reward file written by someone other than farm's witness after the "
    "verifier's reward",
}


def channel_rewards(records: list[WitnessRecord]) -> tuple[list[float], set[str]]:
    """The rewards the verifiers gave through the channel, and the findings about the
    channel and the reward file, over the verify commands' witness reports."""
    given: list[float] = []
    flags: set[str] = set()
    legacy_writes = 0
    for rec in records:
        if not rec.present:
            continue  # no witness ran (no python3): the reward file, as it always was
        if not rec.valid:
            flags.add("runtime:reward_forged")
            continue
        verifiers = [c for c in rec.connections.values() if c.role == "verify"]
        first = verifiers[0].cid if verifiers else None
        mine = [v for cid, v in rec.rewards if cid == first]
        if len(mine) != len(rec.rewards) or any(c.bad for c in verifiers):
            flags.add("runtime:reward_forged")
        writes = sum(1 for what in rec.file_events if "close_write" in what or "moved_to" in what)
        if mine and writes:
            flags.add("runtime:reward_file_rewritten")
        elif not mine:
            legacy_writes += writes
        given.extend(mine)
    if len(given) > 1 or (not given and legacy_writes > 1):
        flags.add("runtime:reward_written_twice")
    return given, flags


def _float(text: str | None) -> tuple[float | None, str]:
    if text is None:
        return None, ""
    try:
        value = float(text.strip())
        if not math.isfinite(value):
            raise ValueError("not finite")
    except ValueError:
        return None, f"reward file holds {text.strip()[:40]!r}, not a float; using passed/total"
    return value, ""

