#!/usr/bin/env python
"""bench_probe: what farm's grading probe and witness cost a test run (grading's own CPU is
spent on every rollout, so what the probe adds to a test run matters).

A project of ``--tests`` tests is written (plain asserts, parametrized ones, unittest
methods, each making ``--compares`` comparisons, the way real suites mix them) and its
pytest run ``--rounds`` times each way, alternated, in one process:

  bare     ``python -m pytest -rA -p no:cacheprovider`` alone
  probe    the same under farm's witness with the probe loaded, fixing the test file
           (``tests/testkit/probe_run.py``: as the grader runs it in a sandbox)

Measured: the CPU (user + system) of the whole run as its parent sees it (the witness,
pytest and what they start), and on the grader's side the time to verify and fold the
witness's report (``read_probe``). Last line:
``bench_probe: tests=N compares=N bare_cpu_ms=… probe_cpu_ms=… added_cpu_ms=… added_cpu_us_per_test=… fold_ms=…``
(medians).

``--quick``: the smallest size, which the test suite runs (it measures nothing).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from farm.grading.probe import read_probe

# pytest under the probe outside a sandbox, as the tests run it (tests/testkit: a test helper,
# not part of the farm package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from testkit.probe_run import run_probe  # noqa: E402


def _project(root: Path, tests: int, compares: int) -> None:
    (root / "tests").mkdir(parents=True)
    (root / "lib.py").write_text("def double(x):\n    return 2 * x\n\n\ndef table(n):\n    return [double(i) for i in range(n)]\n")
    parts = ["import unittest\n\nimport pytest\n\nimport lib\n\n"]
    for i in range(tests // 3):
        parts.append(f"def test_plain_{i}():\n    for k in range({compares}):\n        assert lib.double(k) == 2 * k\n"
                     f"    assert lib.table(20) == [2 * k for k in range(20)]\n\n\n")
        parts.append(f"@pytest.mark.parametrize('x', [{i}])\ndef test_param_{i}(x):\n"
                     f"    assert all(lib.double(k + x) == 2 * (k + x) for k in range({compares}))\n\n\n")
    parts.append("class TestUnit(unittest.TestCase):\n")
    for i in range(tests - 2 * (tests // 3)):
        parts.append(f"    def test_unit_{i}(self):\n        for k in range({compares}):\n"
                     f"            self.assertEqual(lib.double(k), 2 * k)\n\n")
    (root / "tests" / "test_many.py").write_text("".join(parts))
    (root / "pytest.ini").write_text("[pytest]\n")


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", type=int, default=300)
    ap.add_argument("--compares", type=int, default=50, help="comparisons each test makes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the smallest size (the test suite's): 12 tests, one round")
    args = ap.parse_args()
    if args.quick:
        args.tests, args.compares, args.rounds = 12, 3, 1
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _project(root / "p", args.tests, args.compares)
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        cpu = {"bare": [], "probe": []}
        fold: list[float] = []
        for r in range(args.rounds):
            c0 = _cpu()
            bare = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "tests"],
                                  cwd=root / "p", env=env, capture_output=True, text=True)  # fmt: skip
            cpu["bare"].append(_cpu() - c0)
            assert bare.returncode == 0, bare.stdout[-2000:]
            c0 = _cpu()
            res, probe = run_probe(root / "p", ["-q", "tests"], scratch=root / f"s{r}", tests=["tests/test_many.py"],
                                   env=env)  # fmt: skip
            cpu["probe"].append(_cpu() - c0)
            report = Path(probe.report_path).read_text()
            t0 = time.perf_counter()
            for _ in range(10):
                seen = read_probe(report, probe.key)
            fold.append((time.perf_counter() - t0) / 10)
            assert res.returncode == 0 and seen.finished and len(seen.statuses) == args.tests, res.stdout[-2000:]
            assert not (seen.reaches or seen.rigged or seen.forged_lines), seen
        bare_ms, probe_ms = (statistics.median(cpu[w]) * 1000 for w in ("bare", "probe"))
        for way, xs in cpu.items():
            print(f"{way}: cpu ms " + " ".join(f"{x * 1000:.0f}" for x in xs), file=sys.stderr)
        added = probe_ms - bare_ms
        print(f"bench_probe: tests={args.tests} compares={args.compares} bare_cpu_ms={bare_ms:.0f} "
              f"probe_cpu_ms={probe_ms:.0f} added_cpu_ms={added:.0f} added_cpu_us_per_test={added * 1000 / args.tests:.0f} "
              f"fold_ms={statistics.median(fold) * 1000:.1f}")


if __name__ == "__main__":
    main()
