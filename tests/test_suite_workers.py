"""scripts/test.sh runs the suite on pytest-xdist workers, and tests/conftest.py must put
every test that starts a Ray on one worker (one group): a Ray starting beside another
on 2 cores timed out. The grouping goes through xdist's `--dist loadgroup`, which has
silently grouped nothing before (pytest 9.2's structured node ids, which pytest-xdist 3.8
cannot suffix; a worker's `--dist` reading "no"): here a small suite runs on two workers
with the real conftest, and each test reports the worker it ran on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each test writes its name and worker; the Ray tests are the `shared_ray` user and the
# tests marked `starts_ray`, interleaved with plain ones and sleeping a little, so that two
# free workers would share them if they were not one group.
SUITE = '''
import json, os, time
import pytest

def _record(name):
    with open(os.environ["SUITE_OUT"], "a") as fh:
        fh.write(json.dumps({"test": name, "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")
    time.sleep(0.3)

@pytest.fixture(scope="module")
def shared_ray():  # stands in for the conftest's (the grouping reads the fixture's name)
    yield

def test_shared(shared_ray):
    _record("ray-shared")

@pytest.mark.parametrize("i", range(6))
def test_plain(i):
    _record(f"plain-{i}")

@pytest.mark.starts_ray
@pytest.mark.parametrize("i", range(3))
def test_own_ray(i):
    _record(f"ray-own-{i}")
'''


@pytest.mark.slow  # two xdist workers starting: ~10 s on a quiet machine, a minute under load
def test_every_ray_test_runs_on_one_worker(tmp_path):
    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "tests" / "conftest.py")
    (suite / "tests" / "test_mixed.py").write_text(SUITE)
    (suite / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nmarkers = ["starts_ray: starts a Ray", "slow: slow"]\n')
    out = tmp_path / "ran.jsonl"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "tests"], cwd=suite, capture_output=True, text=True,
                         env={**os.environ, "SUITE_OUT": str(out)}, timeout=240)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(ran) == 10, ran
    ray_workers = {r["worker"] for r in ran if r["test"].startswith("ray-")}
    assert len(ray_workers) == 1, ran
    # the other worker was not idle: the plain tests ran beside the Ray group
    assert {r["worker"] for r in ran} == {"gw0", "gw1"}, ran
