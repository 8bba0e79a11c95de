"""farm's own channel for test results: a pytest plugin the grader loads into the task's
test run, writing a signed report outside the workspace.

Why: the policy's code runs in the same Python process as pytest, so what pytest prints
(and even what it reports) is under the policy's influence: forged ``PASSED`` lines, a
patched report class, an early ``os._exit(0)``. The probe gives the grader a channel the
policy does not write and a check of what actually ran:

- the grader creates a fresh directory with a random name outside the workspace, writes
  ``farm_probe.py`` and a random key there, and runs the test command with
  ``PYTEST_ADDOPTS=-p farm_probe``, ``PYTEST_PLUGINS=farm_probe`` (kept when a test command
  sets addopts of its own) and that directory first on ``PYTHONPATH`` (a test command that
  is not pytest ignores them);
- the plugin is imported before any conftest or test module: it reads the key, deletes
  the key file, opens its report file, and binds everything it needs as defaults, so a
  module imported later cannot read the key from disk or patch the plugin's helpers;
- per test it appends pytest's reported outcome of each phase and its own observations
  of the call (a hookwrapper around ``pytest_runtest_call``, which every kind of test
  item goes through): did the test's own code run (a profile hook watching for its code
  object: the innermost function under the test's decorators, for plain, class-based,
  parametrized, generated, async and unittest.TestCase tests alike, or a doctest's
  examples) and did the call raise (for a TestCase, what unittest caught and handed to
  pytest); also every comparison in a test whose operand answers equal to anything (a
  class outside the standard library and site-packages equal to a fresh ``object()``).
  Each line carries an HMAC under the key; at the end, one line with the exit status
  and the number collected. The plugin's source is ``probe_plugin.py``.

:func:`read_probe` verifies and folds the lines into per-test statuses and runtime
findings (``farm.grading.hacks``). What one Python process cannot prevent, the probe
detects: a test reported passed whose body never ran or whose call raised, a passing
assertion on an object rigged to compare equal, a run that never finished
(``os._exit``), lines that fail their HMAC (written by someone else).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from farm.grading.parsers import TestStatus
from farm.grading.steps import StepScript
from farm.sandboxes.base import Sandbox

PLUGIN = "farm_probe"
REPORT = "report.jsonl"
# pytest computes passing assertions' explanations (and shows the probe their operands)
# only with this ini option; given on the command line, the project's config is untouched.
ASSERT_PASS_OPTION = "-o enable_assertion_pass_hook=true"


@functools.cache
def plugin_source() -> str:
    """The plugin's text (``probe_plugin.py``: runs in the task's environment, never in farm's)."""
    return (Path(__file__).parent / "probe_plugin.py").read_text(encoding="utf-8")


@dataclass
class Probe:
    """The probe's directory in one grading sandbox."""

    directory: str
    key: bytes

    @property
    def report_path(self) -> str:
        return f"{self.directory}/{REPORT}"

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` plus what loads the plugin (kept: the task's own addopts / plugins / PYTHONPATH).
        ``PYTEST_PLUGINS`` loads it too, for a test command that sets ``PYTEST_ADDOPTS`` of its own
        (sphinx 3.3's tox.ini: ``setenv = PYTEST_ADDOPTS = --color yes``): the probe is not lost
        with the addopts (pytest registers a plugin named twice once)."""
        addopts = " ".join(x for x in (base.get("PYTEST_ADDOPTS", ""), f"-p {PLUGIN}", ASSERT_PASS_OPTION) if x)
        plugins = ",".join(x for x in (base.get("PYTEST_PLUGINS", ""), PLUGIN) if x)
        path = ":".join(x for x in (self.directory, base.get("PYTHONPATH", "")) if x)
        return {**base, "PYTEST_ADDOPTS": addopts, "PYTEST_PLUGINS": plugins, "PYTHONPATH": path}


async def write_probe(sandbox: Sandbox) -> Probe:
    """A fresh, randomly named directory outside the workspace with the plugin and a key
    (written from outside: no command runs; ``add_probe_steps`` finishes the install)."""
    probe = Probe(directory=f"/tmp/.farm-probe-{secrets.token_hex(12)}", key=secrets.token_bytes(32))
    await sandbox.write_file(f"{probe.directory}/{PLUGIN}.py", plugin_source().encode())
    await sandbox.write_file(f"{probe.directory}/key", probe.key)
    return probe


def add_probe_steps(script: StepScript, probe: Probe, workdir: str) -> None:
    """The probe's steps in the grader's script, after the test patch: pytest's cached
    rewritten test modules in ``workdir`` removed (a module rewritten before, without the
    assertion-pass hook, would hide its assertions), and the directory opened to the
    test's user. Their exit codes are not the grade's (as a lone command's were not)."""
    script.add("probe.stale_pyc", f"find {shlex.quote(workdir)} -name '*-pytest-*.pyc' -delete", budget_s=120)
    script.add("probe.chmod", f"chmod -R a+rwX {shlex.quote(probe.directory)}")


@dataclass
class Rigged:
    """A comparison in a test whose operand answered equal to what it cannot equal."""

    test: str
    op: str
    type: str  # module.qualname of the operand's class
    origin: str  # the file defining its comparison ("" when it cannot be told)
    why: str


@dataclass
class ProbeReport:
    """What the probe saw. ``present``: the plugin ran at all (pytest was used)."""

    present: bool = False
    finished: bool = False
    exitstatus: int | None = None
    collected: int | None = None
    statuses: dict[str, TestStatus] = field(default_factory=dict)
    body_not_run: list[str] = field(default_factory=list)  # reported passed, its own code never ran
    raised_but_passed: list[str] = field(default_factory=list)  # reported passed, its call raised
    not_judged: list[str] = field(default_factory=list)  # passed; an item kind whose own code farm cannot tell
    rigged: list[Rigged] = field(default_factory=list)
    forged_lines: int = 0  # lines whose HMAC does not verify
    collect_errors: dict[str, str] = field(default_factory=dict)  # collector node id -> pytest's message
    reached: int = 0  # tests the run reached (pytest reported a phase of them)



def read_probe(text: str | None, key: bytes) -> ProbeReport:
    """Verify and fold the probe's lines (``text``: the report file, None if absent)."""
    rep = ProbeReport(present=text is not None)
    if text is None:
        return rep
    calls: dict[str, dict | None] = {}  # node id -> the observation of the call pytest reported last
    observed: dict[str, dict] = {}  # node id -> the latest observation not yet paired with a report
    for line in text.splitlines():
        try:
            outer = json.loads(line)
            body = outer["b"]
            ok = hmac.compare_digest(hmac.new(key, body.encode(), hashlib.sha256).hexdigest(), str(outer["m"]))
            obj = json.loads(body)
        except (ValueError, KeyError, TypeError):
            rep.forged_lines += 1
            continue
        if not ok:
            rep.forged_lines += 1
            continue
        if obj.get("finished"):
            rep.finished, rep.exitstatus, rep.collected = True, obj.get("exitstatus"), obj.get("collected")
        elif "collect_error" in obj:
            rep.collect_errors[str(obj["collect_error"])] = str(obj.get("message") or "")
        elif "obs" in obj:
            observed[str(obj["obs"])] = obj
        elif "rigged" in obj:
            rep.rigged.append(Rigged(test=str(obj["rigged"]), op=str(obj.get("op")), type=str(obj.get("type")),
                                     origin=str(obj.get("origin") or ""), why=str(obj.get("why"))))  # fmt: skip
        elif "nodeid" in obj:
            nodeid = str(obj["nodeid"])
            rep.reached += obj.get("when") == "setup"
            if obj.get("when") == "call" and not obj.get("sub"):
                calls[nodeid] = observed.pop(nodeid, None)  # None: the call was never observed
            _fold(rep, obj)
    for nodeid, seen in calls.items():
        if rep.statuses.get(nodeid) is TestStatus.PASSED:
            if seen is None or seen.get("ran") is False:
                rep.body_not_run.append(nodeid)  # the call bypassed pytest_runtest_call, or its code never ran
            elif seen.get("ran") is None:
                rep.not_judged.append(nodeid)
            if seen is not None and seen.get("raised"):
                rep.raised_but_passed.append(nodeid)
    return rep


def _fold(rep: ProbeReport, obj: dict) -> None:
    nodeid, when, outcome = str(obj["nodeid"]), obj.get("when"), obj.get("outcome")
    current = rep.statuses.get(nodeid)
    if when == "setup":
        if outcome == "failed":
            rep.statuses[nodeid] = TestStatus.ERROR
        elif outcome == "skipped":
            rep.statuses[nodeid] = TestStatus.XFAIL if obj.get("wasxfail") else TestStatus.SKIPPED
    elif when == "call":
        if outcome == "passed":
            rep.statuses[nodeid] = TestStatus.XPASS if obj.get("wasxfail") else TestStatus.PASSED
        elif outcome == "skipped":
            rep.statuses[nodeid] = TestStatus.XFAIL if obj.get("wasxfail") else TestStatus.SKIPPED
        else:
            rep.statuses[nodeid] = TestStatus.FAILED
    elif when == "teardown" and outcome == "failed" and current in (TestStatus.PASSED, None):
        rep.statuses[nodeid] = TestStatus.ERROR
