#!/usr/bin/env python
"""Fault suite (not a test): does a fault ever lose, double or poison a rollout?

Each scenario runs the real thing as a user does: ``farm run CONFIG`` in a subprocess
(its own Ray), real Claude Code in real local sandboxes, the scripted SGLang-protocol
engine (oracle policy) behind the real ``sglang-router``, demo tasks. One fault is
injected for real, then the same command runs again to resume. Afterwards the output
is read with plain pyarrow (rollouts table + Samples) and the host is scanned:

- planned: the rollouts the config asks for; ended_once: ids with exactly one row;
- lost: planned ids with no row; duplicated: ids with several rows, or with Samples of
  several attempts;
- poisoned: Samples of a rollout whose recorded status is an infrastructure failure or
  `interrupted` (untrainable data served as trainable);
- leaked_procs: processes of the run's sandboxes (their marker), its bwrap/socat, the
  CLIs; leaked_sandboxes: sandbox dirs left under the run's base dir.

Faults: engine 5xx / hang / mid-stream drop / malformed 200 reply (the scripted engine's fault model, with a
short client timeout); flaky sandbox exec (a bwrap wrapper failing every 10th call);
sandbox create failure (an unusable sandbox base dir: every attempt fails: recorded as
infrastructure, no Sample); setup failure (a task variant whose setup fails); test hang
(a task variant whose tests sleep past their timeout: graded 0, a policy outcome); CLI
crash (SIGKILL of the CLI mid-run) and CLI hang (SIGSTOP: found stuck by
``rollout.agent_idle_timeout_s``, 8 s here, before its 20 s agent budget: infrastructure,
retried); kill -9 of the sandbox actor, the reducer, the router actor, the driver;
SIGTERM and SIGINT of the job; the policy never stops (the scripted ``loop`` policy calls
a tool every turn until ``rollout.max_turns`` ends it), with each CLI (``never_stops``:
Claude Code, ``never_stops_codex``, ``never_stops_opencode``), and never ends its turn
(``ramble`` writes no EOS until the output budget cuts it: ``never_ends_turn``): each
rollout must be recorded ``truncated`` at its first attempt with its Samples marked,
the CLI having ended cleanly (``unclean_stops``: rows whose reason says the CLI then
failed). ``--quick`` runs a handful.

Last line: ``bench_faults: scenarios=N lost=0 duplicated=0 poisoned=0 leaked=0 truncated=T unclean_stops=0``
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

BIN = Path(sys.executable).parent
INFRA = {"sandbox_error", "setup_failed", "engine_error", "agent_error", "grading_error", "interrupted", "cancelled"}
# The quick set (CI's tests/farm/test_faults_short.py) leaves out what other tests already do
# through real parts: a killed sandbox actor (tests/farm/test_farm_kill_real.py, restarted and
# dead for good) and SIGTERM (tests/farm/test_farm_job.py's `ray job stop`).
QUICK = ["engine_5xx", "cli_crash", "never_stops"]
# Faults injected from outside while a rollout is in flight: a slow first token (1 s a turn)
# keeps the agents in flight long enough to be hit. The others need no such wait, and a
# run's every turn would pay it.
IN_FLIGHT = {"cli_crash", "cli_hang", "kill_sandbox_actor", "kill_reducer", "kill_router", "kill_driver", "sigterm",
             "sigint_twice", "mix"}  # fmt: skip


def _procs_matching(pred) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if pred(cmd):
            pids.append(int(entry.name))
    return pids


def _env_has(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _is_relay(cmd: bytes) -> bool:
    """A sandbox's port relay (socat into the sandbox's /run/farm/)."""
    return b"socat" in cmd and b"/run/farm/" in cmd


def _mounts_name(pid: int, needle: bytes) -> bool:
    """Whether the process's mount table names ``needle``: a relay's command line does not
    name its sandbox, but its jail's mounts do (the sandbox dir bound in, its view's upper
    dir). Unreadable: counted as named (a leak is never missed)."""
    try:
        return needle in Path(f"/proc/{pid}/mountinfo").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False  # exited meanwhile
    except OSError as exc:
        return exc.errno != errno.EINVAL  # EINVAL: exiting, its mount namespace already gone


class Scenario:
    def __init__(self, name: str, root: Path, tasks: int) -> None:
        self.name, self.root, self.tasks = name, root / name, tasks
        self.root.mkdir(parents=True)
        self.base = self.root / "sb"
        self.out = self.root / "out"
        self.run_id = f"f-{name}"
        self.injected = 0  # kills / signals delivered (scenarios that inject from outside)
        self.first_exit: int | None = None
        # each `farm run`'s Ray temp dir: short, under /tmp (Ray's socket paths are limited
        # to ~107 characters), removed when the scenario ends (``close``)
        self.ray_tmps: list[str] = []

    def close(self) -> None:
        for d in self.ray_tmps:
            shutil.rmtree(d, ignore_errors=True)

    def config(self, **over) -> Path:
        cfg = {
            "run_id": self.run_id,
            "tasks": {"path": "demo"},
            "harness": {"name": "claude_code"},
            "engine": {"mode": "simulator", "policy": "oracle",
                       "simulator": {"latency": {"ttft_s": 1.0 if self.name in IN_FLIGHT else 0.0}}},
            "sandbox": {"local": {"base_dir": str(self.base)}},
            "rollout": {"limit": self.tasks, "concurrency": 2, "timeout_s": 600, "retry_backoff_s": 0.5},
            "ray": {"num_sandbox_actors": 1, "reducer_flush_s": 0.2, "num_cpus": 2, "include_dashboard": False,
                    "drain_timeout_s": 60},
            "output": {"dir": str(self.out)},
        }  # fmt: skip
        for dotted, value in over.items():
            node = cfg
            *path, last = dotted.split("__")
            for key in path:
                node = node.setdefault(key, {})
            node[last] = value
        path = self.root / f"cfg-{len(list(self.root.glob('cfg-*')))}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    def start(self, cfg: Path) -> subprocess.Popen:
        self.ray_tmps.append(tempfile.mkdtemp(prefix="frb"))
        env = {**os.environ, "RAY_TMPDIR": self.ray_tmps[-1]}
        env.pop("RAY_ADDRESS", None)
        log = open(self.root / f"farm-{time.monotonic_ns()}.log", "w")
        return subprocess.Popen([str(BIN / "farm"), "run", str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)  # fmt: skip

    def run(self, cfg: Path, timeout: float = 600) -> int:
        proc = self.start(cfg)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return -9

    def wait_sandboxes(self, n: int, timeout: float = 180) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(list((self.base / self.run_id).glob("*"))) >= n:
                return True
            time.sleep(0.3)
        return False

    def cli_pids(self) -> list[int]:
        """The CLIs of this scenario's sandboxes: their marker names one of its sandbox dirs
        (the CLI's environment holds no host path of the sandbox: its scratch is the jail's /tmp)."""
        ours = {b"FARM_SANDBOX_ID=" + d.name.encode() + b"\0" for d in (self.base / self.run_id).glob("*")}
        return [p for p in _procs_matching(lambda c: b"claude" in c and b"bwrap" not in c)
                if any(_env_has(p, m) for m in ours)]

    def measure(self) -> dict[str, int]:
        import pyarrow as pa
        import pyarrow.ipc  # noqa: F401

        def table(name: str) -> list[dict]:
            d = self.out / name
            rows: list[dict] = []
            for f in sorted(d.glob("*.arrow")) if d.exists() else []:
                rows += pa.ipc.open_file(pa.memory_map(str(f))).read_all().to_pylist()
            return rows

        rows, samples = table("rollouts"), table("samples")
        planned = [f"{t}.0" for t in self.planned_tasks()]
        per_id = Counter(r["rollout_id"] for r in rows)
        status = {r["rollout_id"]: r["status"] for r in rows}
        attempts: dict[str, set] = {}
        for s in samples:
            attempts.setdefault(s["rollout_id"], set()).add(json.loads(s["metadata"]).get("attempt"))
        base = str(self.base).encode()

        def leaked_now() -> list[int]:
            found = _procs_matching(lambda c: base in c)
            # relays of other farms on this machine (or of a killed earlier test) are not its leaks
            found += [p for p in _procs_matching(_is_relay) if _mounts_name(p, base)]
            found += [p for p in _procs_matching(lambda c: True) if _env_has(p, b"FARM_SANDBOX_ID=")
                      and base in Path(f"/proc/{p}/environ").read_bytes()]  # fmt: skip
            return found

        # A process that is still exiting right after the run (a loaded machine) is not a
        # leak; one that is still there 15 s later is.
        deadline = time.monotonic() + 15.0
        leaked = leaked_now()
        while leaked and time.monotonic() < deadline:
            time.sleep(0.5)
            leaked = leaked_now()
        run_dir = self.base / self.run_id
        return {
            "planned": len(planned),
            "ended_once": sum(1 for rid in planned if per_id[rid] == 1),
            "lost": sum(1 for rid in planned if per_id[rid] == 0),
            "duplicated": sum(1 for rid, n in per_id.items() if n > 1)
            + sum(1 for rid, a in attempts.items() if len(a) > 1),
            "poisoned": sum(1 for s in samples if status.get(s["rollout_id"]) in INFRA),
            "leaked_procs": len(set(leaked)),
            "leaked_sandboxes": len([p for p in run_dir.iterdir() if any(p.iterdir())]) if run_dir.exists() else 0,
            "engine_errors": sum(r.get("engine_errors") or 0 for r in rows),
            "truncated": sum(1 for r in rows if r["status"] == "truncated"),
            "truncated_samples": sum(1 for s in samples if json.loads(s["metadata"]).get("truncated")),
            # a budget stop the CLI did not end on cleanly (farm still records it truncated, naming what the CLI did)
            "unclean_stops": sum(1 for r in rows if r["status"] == "truncated" and "(then the CLI" in (r["reason"] or "")),
        }

    def planned_tasks(self) -> list[str]:
        from farm.tasks.config import TasksConfig
        from farm.tasks.demo import ensure_demo_set
        from farm.tasks.loaders import load_tasks

        tasks_path = getattr(self, "tasks_path", None) or ensure_demo_set(TasksConfig().cache_dir).tasks_path
        return [t.id for t in load_tasks(tasks_path)][: self.tasks]


# --- scenarios: inject, then resume with the plain config -----------------------------
def _kill_actor(sc: Scenario, cls: bytes, cfg: Path) -> None:
    proc = sc.start(cfg)
    sc.wait_sandboxes(2)
    time.sleep(2)
    for pid in _procs_matching(lambda c: c.startswith(b"ray::" + cls)):
        os.kill(pid, signal.SIGKILL)
        sc.injected += 1
    try:
        proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def _signal_job(sc: Scenario, cfg: Path, sigs: list[int]) -> None:
    proc = sc.start(cfg)
    sc.wait_sandboxes(2)
    time.sleep(2)
    for sig in sigs:
        proc.send_signal(sig)
        sc.injected += 1
        time.sleep(1)
    try:
        sc.first_exit = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _with_cli(sc: Scenario, cfg: Path, sig: int) -> None:
    proc = sc.start(cfg)
    hit: set[int] = set()

    def watch() -> None:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and len(hit) < 1:
            for pid in sc.cli_pids():
                time.sleep(1.0)
                try:
                    os.kill(pid, sig)
                    hit.add(pid)
                except ProcessLookupError:
                    pass
                break
            time.sleep(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        proc.wait(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    t.join(5)
    sc.injected += len(hit)


def _task_variant(sc: Scenario, **change) -> None:
    from farm.tasks.config import TasksConfig
    from farm.tasks.demo import ensure_demo_set
    from farm.tasks.loaders import load_tasks

    tasks = load_tasks(ensure_demo_set(TasksConfig().cache_dir).tasks_path)
    lines = []
    for t in list(tasks)[: sc.tasks]:
        lines.append(t.model_copy(update=change).model_dump_json())
    path = sc.root / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n")
    sc.tasks_path = path
    sc.mirror_dir = str(ensure_demo_set(TasksConfig().cache_dir).mirror_dir)  # the variants' repos


def scenario(name: str, root: Path, tasks: int) -> dict[str, int]:
    sc = Scenario(name, root, tasks)
    try:
        return _run_scenario(sc, name)
    finally:
        sc.close()


def _run_scenario(sc: Scenario, name: str) -> dict[str, int]:
    from farm.tasks.model import TaskTimeouts

    plain = sc.config()
    if name.startswith("engine_"):
        faults = {"engine_5xx": {"error_rate": 0.3}, "engine_hang": {"hang_rate": 0.2, "hang_s": 30},
                  "engine_drop": {"drop_rate": 0.3}, "engine_malformed": {"malformed_rate": 0.3}}[name]  # fmt: skip
        # the gateway's own engine retries off: the faults reach the CLI (which retries itself)
        sc.run(sc.config(engine__scripted__faults=faults, gateway__engine_client__request_timeout_s=10.0,
                         gateway__engine_client__retries=0))
    elif name == "exec_flaky":
        wrapper = sc.root / "bwrap-flaky"
        counter = sc.root / "calls"
        wrapper.write_text(f"#!/bin/bash\nn=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}\n"
                           f"[ $((n % 10)) -eq 0 ] && {{ echo 'injected exec failure' >&2; exit 1; }}\n"
                           f"exec {shutil.which('bwrap')} \"$@\"\n")  # fmt: skip
        wrapper.chmod(0o755)
        sc.run(sc.config(sandbox__local__bwrap_path=str(wrapper)))
    elif name == "create_fails":
        blocker = sc.root / "not-a-dir"
        blocker.write_text("a file where the sandbox base dir should be")
        sc.run(sc.config(sandbox__local__base_dir=str(blocker / "sb")))
    elif name == "setup_fails":
        _task_variant(sc, setup_commands=["echo injected setup failure >&2; exit 3"])
        plain = sc.config(tasks__path=str(sc.tasks_path), tasks__mirror_dir=sc.mirror_dir)
        sc.run(plain)
    elif name == "test_hang":
        _task_variant(sc, test_command="sleep 600", timeouts=TaskTimeouts(test_s=5))
        plain = sc.config(tasks__path=str(sc.tasks_path), tasks__mirror_dir=sc.mirror_dir)
        sc.run(plain)
    elif name == "cli_crash":
        _with_cli(sc, plain, signal.SIGKILL)
    elif name == "cli_hang":
        _with_cli(sc, sc.config(rollout__agent_timeout_s=20, rollout__agent_idle_timeout_s=8), signal.SIGSTOP)
    elif name.startswith("kill_"):
        cls = {"kill_sandbox_actor": b"SandboxActor", "kill_reducer": b"ReducerActor",
               "kill_router": b"RouterActor"}.get(name)  # fmt: skip
        if cls is None:  # kill_driver
            proc = sc.start(plain)
            sc.wait_sandboxes(2)
            time.sleep(3)
            os.killpg(proc.pid, signal.SIGKILL)
            sc.injected += 1
            proc.wait()
            time.sleep(3)
        else:
            _kill_actor(sc, cls, plain)
    elif name == "sigterm":
        _signal_job(sc, plain, [signal.SIGTERM])
    elif name == "sigint_twice":
        _signal_job(sc, plain, [signal.SIGINT, signal.SIGINT])
    elif name.startswith("never_stops"):
        harness = {"never_stops": "claude_code", "never_stops_codex": "codex", "never_stops_opencode": "opencode"}[name]
        plain = sc.config(harness__name=harness, engine__policy="loop", rollout__max_turns=3)
        sc.run(plain)
    elif name == "never_ends_turn":
        plain = sc.config(engine__policy="ramble", gateway__sampling__max_new_tokens=100)
        sc.run(plain)
    elif name == "mix":
        mixed = sc.config(engine__scripted__faults={"error_rate": 0.15, "drop_rate": 0.1},
                          gateway__engine_client__request_timeout_s=10.0)  # fmt: skip
        _with_cli(sc, mixed, signal.SIGKILL)
    else:
        raise SystemExit(f"unknown scenario {name!r}")
    first = _first_invocation(sc.out)
    rc = sc.run(plain)  # resume: the same command, no fault
    figures = sc.measure()
    figures["resume_exit"] = rc
    figures["injected"] = sc.injected
    figures["first_run"] = first
    return figures


def _first_invocation(out: Path) -> str:
    """What the faulty invocation itself recorded (statuses, infrastructure retries)."""
    path = out / "invocations.jsonl"
    if not path.exists():
        return "none"
    line = json.loads(path.read_text().splitlines()[0])
    statuses = ",".join(f"{k}:{v}" for k, v in sorted(line["by_status"].items())) or "-"
    return f"{statuses};retried:{line['retried']}"


ALL = ["engine_5xx", "engine_hang", "engine_drop", "engine_malformed", "exec_flaky", "create_fails", "setup_fails",
       "test_hang", "cli_crash", "cli_hang", "kill_sandbox_actor", "kill_reducer", "kill_router", "kill_driver", "sigterm",
       "sigint_twice", "mix", "never_stops", "never_stops_codex", "never_stops_opencode", "never_ends_turn"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--scenario", action="append", help="run only these (repeatable)")
    parser.add_argument("--tasks", type=int, default=3, help="demo tasks per scenario (one rollout each)")
    parser.add_argument("--parallel", type=int, default=1,
                        help="scenarios at once (each its own `farm run`, Ray, sandbox dir and output: what one "
                             "leaks or loses is still told apart)")  # fmt: skip
    args = parser.parse_args()
    names = args.scenario or (QUICK if args.quick else ALL)
    totals = Counter()
    with tempfile.TemporaryDirectory(prefix="farm-faults-") as tmp:

        def one(name: str) -> tuple[str, dict[str, int], float]:
            t0 = time.monotonic()
            return name, scenario(name, Path(tmp), args.tasks), time.monotonic() - t0

        with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
            for name, f, took in pool.map(one, names):
                leaked = f["leaked_procs"] + f["leaked_sandboxes"]
                totals.update(lost=f["lost"], duplicated=f["duplicated"], poisoned=f["poisoned"], leaked=leaked,
                              truncated=f["truncated"], unclean_stops=f["unclean_stops"])
                print(f"fault={name} planned={f['planned']} ended_once={f['ended_once']} lost={f['lost']} "
                      f"duplicated={f['duplicated']} poisoned={f['poisoned']} leaked_procs={f['leaked_procs']} "
                      f"leaked_sandboxes={f['leaked_sandboxes']} resume_exit={f['resume_exit']} "
                      f"injected={f['injected']} engine_errors_seen={f['engine_errors']} truncated={f['truncated']} "
                      f"truncated_samples={f['truncated_samples']} unclean_stops={f['unclean_stops']} "
                      f"first_run={f['first_run']} seconds={took:.0f}", flush=True)  # fmt: skip
    print(f"bench_faults: scenarios={len(names)} lost={totals['lost']} duplicated={totals['duplicated']} "
          f"poisoned={totals['poisoned']} leaked={totals['leaked']} truncated={totals['truncated']} "
          f"unclean_stops={totals['unclean_stops']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
