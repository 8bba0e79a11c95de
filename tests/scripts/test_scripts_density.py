"""scripts/bench_density.py runs at its smallest size (``--quick``), so a refactor that breaks
it fails the suite rather than the next measurement: one farm rollout and one bare rollout
of a demo task, real sandboxes and CLIs, and the last line's figures."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from bench_lines import assert_last_line

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_density_quick_prints_its_figures(tmp_path: Path, tokenizer_dir: Path) -> None:
    cache = tmp_path / "tokenizers"  # the session's builtin tokenizer: the benchmark trains none
    cache.mkdir()
    (cache / "farm-test").symlink_to(tokenizer_dir, target_is_directory=True)
    res = subprocess.run([sys.executable, "scripts/bench_density.py", "--quick", "--cache-dir", str(cache)], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200, env={**os.environ, "TMPDIR": str(tmp_path)})
    out = res.stdout.strip().splitlines()
    assert res.returncode == 0 and out, res.stderr[-3000:]
    fig = {k: float(v) for k, v in assert_last_line(out[-1], ROOT / "scripts" / "bench_density.py").items()}
    assert 0 < fig["in_flight"] <= 1.0 and 0 < fig["slot_utilization"] <= 1.0
    runs = [line for line in out if re.match(r"bench_density\[(pool|cold|bare) n=", line)]
    assert runs and all(re.search(r" rollouts_per_min=[0-9.]+ ", line) for line in runs)
    assert re.search(r"^bench_density\[delivered\]: farm_max_rollouts_per_min=[0-9.]+ bare_max_rollouts_per_min=[0-9.]+ "
                     r"ratio=[0-9.]+$", res.stdout, re.M), res.stdout[-3000:]
    farm = next(line for line in out if line.startswith("bench_density[pool n=1]:"))
    assert re.search(r" loop_lag_p50_ms=[0-9.]+ loop_lag_p95_ms=[0-9.]+ loop_lag_max_ms=[0-9.]+ ", farm), farm
    assert " rollouts=1 " in farm and " resolved=1 " in farm, farm  # its one rollout's tests passed, as bare's
    assert fig["farm_cpu_ms_per_turn"] > 0 and 0 < fig["farm_cpu_share"] < 1
    # farm's CPU split: the gateway's per turn, the rest once a rollout (one rollout here)
    assert 0 < fig["farm_turn_path_ms_per_turn"] < fig["farm_cpu_ms_per_turn"] and fig["farm_once_ms_per_rollout"] > 0
    assert fig["capacity_ratio"] > 0 or math.isnan(fig["capacity_ratio"])
    # each way, its one rollout completed: farm's graded, bare's resolved by the oracle
    assert re.search(r"^  statuses=\{'completed': 1\}$", res.stdout, re.M), res.stdout[-3000:]
    bare = next(line for line in out if line.startswith("bench_density[bare n=1]:"))
    assert " rollouts=1 " in bare and " resolved=1 " in bare, bare
    # the node's CPU by owner: the CLI, its tools, the test command, farm's process, all counted
    owners = next(line for line in out if line.startswith("  cpu_s_per_rollout=") and "agent.cli" in line)
    for owner in ("agent.cli", "agent.tools", "agent.jail", "grading.test", "farm.process", "engine"):
        assert f"'{owner}': " in owners, owners


def _script_module(name: str):  # noqa: ANN202 - the script's module
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def _density_slots():  # noqa: ANN202 - the script's module
    return _script_module("density_slots")


def test_rollouts_per_min_counts_each_rollout_by_its_share_in_the_window() -> None:
    """Busy slots are not delivered rollouts: a rollout counts by the part of its run inside
    the window, so one that takes twice as long delivers half as much a minute."""
    slots = _density_slots()
    records = [{"start": 0.0, "end": 60.0}, {"start": 60.0, "end": 180.0}]
    assert slots.finished_per_min(records, 0.0, 120.0) == 0.8  # 1 + 1/2 in two minutes (0.75)
    records = [{"start": -30.0, "end": 30.0}, {"start": 0.0, "end": 240.0}]
    assert slots.finished_per_min(records, 0.0, 120.0) == 0.5  # 1/2 + 1/2


def test_capacity_is_narrowed_between_the_steps_turn_about() -> None:
    """After the steps (8, 16, 24, 32, 48), each one's gap between its last busy count and its
    first not is halved down to the resolution, farm's and bare's runs taking turns."""
    import asyncio

    narrow = _density_slots().narrow

    limits = {"farm": 29, "bare": 41}  # the most slots each keeps busy
    ran: list[tuple[str, int]] = []

    async def busy(who: str, n: int) -> bool:
        ran.append((who, n))
        return n <= limits[who]

    capacity, failed = {"farm": 24, "bare": 32}, {"farm": 32, "bare": 48}
    asyncio.run(narrow(capacity, failed, 4, busy))
    assert capacity == {"farm": 28, "bare": 40} and failed == {"farm": 32, "bare": 44}
    assert ran == [("farm", 28), ("bare", 40), ("bare", 44)]
    # finer: down to a slot; none kept busy at all: from 0; resolution 0: the steps alone
    capacity, failed = {"farm": 24}, {"farm": 32}
    asyncio.run(narrow(capacity, failed, 1, busy))
    assert capacity == {"farm": 29} and failed == {"farm": 30}
    capacity, failed, ran[:] = {}, {"farm": 8}, []
    asyncio.run(narrow(capacity, failed, 4, lambda who, n: asyncio.sleep(0, False)))
    assert capacity == {} and failed == {"farm": 4}
    asyncio.run(narrow(capacity := {"farm": 24}, failed := {"farm": 48}, 0, busy))
    assert capacity == {"farm": 24} and ran == []


def test_staggered_slots_start_spread_over_a_rollout_and_the_window_opens_after() -> None:
    """With a stagger the slots start one after another (slot 3 of 4 after slot 0's first
    rollout has ended) and the window opens when the last has started; without one every slot
    starts before any rollout ends. (Orders of events on one loop, not durations.)"""
    import asyncio

    slots = _density_slots()

    async def one(i: int, k: int, phases: list) -> int:
        await asyncio.sleep(0.05)  # the rollout: it takes a while
        return i

    async def run(stagger: float) -> tuple[dict[int, dict], float, float]:
        """Each slot's first rollout (its record: ``result`` is the slot), the window."""
        records, t0, t1 = await slots.slots(4, 0.2, one, stagger)
        firsts: dict[int, dict] = {}
        for r in sorted(records, key=lambda r: r["start"]):
            firsts.setdefault(r["result"], r)
        return firsts, t0, t1

    firsts, t0, t1 = asyncio.run(run(0.4))
    assert [firsts[i]["start"] for i in range(4)] == sorted(firsts[i]["start"] for i in range(4))
    assert firsts[3]["start"] > firsts[0]["end"]  # spread: slot 3 waited 0.3 s, slot 0's rollout 0.05
    assert t0 > firsts[0]["start"] and t1 - t0 == pytest.approx(0.2)
    firsts, t0, t1 = asyncio.run(run(0.0))
    assert max(firsts[i]["start"] for i in range(4)) < min(firsts[i]["end"] for i in range(4))
    assert t0 <= firsts[0]["start"]  # the window opens with the first start


def test_a_test_run_no_sampling_caught_is_still_the_tests_not_farms() -> None:
    """A graded test run shorter than the ledger's sampling period ends before any read of its
    jail: its CPU stays the test's (jail unknown), never farm's own commands; what farm itself
    ran in the sandbox stays farm's."""
    from types import SimpleNamespace

    from farm.sandboxes.usage import CommandCPU

    density_ledger = _script_module("density_ledger")
    ledger = density_ledger.NodeLedger(0, test_commands=["python -m pytest -rA tests/test_romans.py"])
    witnessed = 'export PATH=/v/bin:"$PATH"\nif [ -e /tmp/.farm-probe-ab12/report ]; then rm -f ...'
    book = SimpleNamespace(total_s=lambda: 0.5, commands=[
        CommandCPU(key=1, describe="__B=farm-step-1 ...", cpu_s=0.02, alone=True),
        CommandCPU(key=2, describe=witnessed, cpu_s=0.4, alone=True),  # never sampled
        CommandCPU(key=3, describe=witnessed, cpu_s=0.05, alone=True),  # sampled: jail 0.01
    ])  # fmt: skip
    sandbox = SimpleNamespace(cpu=book, labels={"purpose": "grading"})
    ledger._long[(id(sandbox), 3)] = density_ledger._Long(jail_s=0.01)
    ledger._account(sandbox)
    owners = ledger.ledger.owners
    assert owners["grading.test"] == pytest.approx(0.44)
    assert owners["grading.jail"] == pytest.approx(0.01)
    assert owners["grading.own_cmds"] == pytest.approx(0.02)
    assert owners["grading.between_commands"] == pytest.approx(0.03)
    assert ledger.ledger.unsampled == 1
