"""Every benchmark runs: each ``scripts/bench_*.py`` at its smallest size (``--quick``), as a
user runs it (a subprocess from the repository root), so that a refactor that breaks one
fails here and not at the next measurement. Its last line must hold the figures its
docstring promises, each a number (``bench_lines``); the figures themselves are not checked:
a quick size measures nothing. The builtin tokenizer the benchmarks load is the session's
(built once for the suite). Three benchmarks are run by a test of their own, which also
checks what they find (bench_faults: tests/farm/test_faults_short.py; bench_learning:
tests/farm/test_train_loop_example.py; bench_density: tests/scripts/test_scripts_density.py);
the last test below finds every benchmark a test."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from bench_lines import assert_last_line

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
slow = pytest.mark.slow
own_ray = [slow, pytest.mark.starts_ray]  # under xdist: on the worker that runs every Ray (tests/conftest.py)

# script, whether it loads the builtin tokenizer (--cache-dir), whether it starts a Ray of its own
QUICK = [
    pytest.param("bench_trajectory.py", False, False, id="trajectory"),
    pytest.param("bench_samples_read.py", False, False, id="samples_read"),
    pytest.param("bench_resume.py", False, False, id="resume"),
    pytest.param("bench_capture.py", False, False, id="capture"),  # a real local sandbox
    pytest.param("bench_probe.py", False, False, id="probe"),  # pytest bare and under the witness + probe
    pytest.param("bench_bodies.py", False, False, id="bodies"),  # the gateway's request-body models
    pytest.param("bench_routing.py", True, False, id="routing", marks=slow),
    pytest.param("bench_report.py", True, False, id="report", marks=slow),  # headless Chromium
    pytest.param("bench_gateway.py", True, False, id="gateway", marks=slow),  # sandboxes, gateway subprocesses
    pytest.param("bench_scale.py", False, True, id="scale", marks=own_ray),
    pytest.param("bench_envs.py", False, True, id="envs", marks=own_ray),  # real package installs, Claude Code
    pytest.param("bench_nodes.py", False, True, id="nodes", marks=own_ray),  # a 4-node Ray cluster, Claude Code
    pytest.param("bench_images.py", False, False, id="images", marks=slow),  # a real registry, image sandboxes
    pytest.param("bench_snapshot_caches.py", False, False, id="snapshot_caches", marks=slow),  # real uv installs
]
# benchmarks no test runs yet: their quick size is being reworked with them; once a test runs
# one (names it and "--quick"), the last test fails until it leaves this set
PENDING: set[str] = set()


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A ``--cache-dir`` holding the session's builtin tokenizer (what ``builtin:farm-test``
    builds: the same trainer, the same defaults), so no benchmark trains its own."""
    cache = tmp_path_factory.mktemp("bench-tokenizers")
    (cache / "farm-test").symlink_to(tokenizer_dir, target_is_directory=True)
    return cache


@pytest.mark.timeout(1200)
@pytest.mark.parametrize(("script", "tokenizer", "own_ray"), QUICK)
def test_the_benchmark_runs_at_its_smallest_size(script: str, tokenizer: bool, own_ray: bool,
                                                 request: pytest.FixtureRequest) -> None:  # fmt: skip
    argv = [sys.executable, str(SCRIPTS / script), "--quick"]
    if tokenizer:
        argv += ["--cache-dir", str(request.getfixturevalue("tokenizer_cache"))]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    ray_tmp = tempfile.mkdtemp(prefix="frb") if own_ray else None  # short: Ray's socket paths
    if ray_tmp:
        env["RAY_TMPDIR"] = ray_tmp
    try:
        proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1150)
    finally:
        if ray_tmp:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, f"{script} --quick failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} --quick printed nothing:\n{proc.stderr[-2000:]}"
    assert_last_line(lines[-1], SCRIPTS / script)


def test_the_image_benchmark_unpacks_a_tree_of_ones_choosing() -> None:
    """``bench_images.py --tree DIR``: the held-out measurement (a tree the unpack was not tuned
    on) is the benchmark's, not a one-off script's; here on farm's own sources, one round."""
    proc = subprocess.run([sys.executable, str(SCRIPTS / "bench_images.py"), "--tree", str(ROOT / "farm"), "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    *_, named, last = proc.stdout.strip().splitlines()
    assert named == f"bench_images_tree (the tree): {ROOT / 'farm'}"
    names = ["tree_mb", "files", "unpack_mb_s", "gnu_tar_mb_s", "unpack_cpu_mb_s", "gnu_tar_cpu_mb_s"]
    assert re.fullmatch("bench_images_tree: " + " ".join(rf"{n}=[0-9.]+" for n in names), last), last
    files = int(last.split("files=")[1].split()[0])
    assert files >= sum(1 for p in (ROOT / "farm").rglob("*") if p.is_file())  # every file of the tree unpacked


def test_every_benchmark_has_a_quick_run_in_the_suite() -> None:
    here = {p.values[0] for p in QUICK}
    others = [p for p in (ROOT / "tests").rglob("test_*.py") if p != Path(__file__).resolve()]
    elsewhere = {s.name for s in SCRIPTS.glob("bench_*.py")
                 for t in others if s.name in (text := t.read_text()) and "--quick" in text}  # fmt: skip
    scripts = {p.name for p in SCRIPTS.glob("bench_*.py")}
    assert here <= scripts, f"no such benchmark: {sorted(here - scripts)}"
    run_now = PENDING & (here | elsewhere)
    assert not run_now, f"run by a test now, take them off PENDING: {sorted(run_now)}"
    assert scripts - here - elsewhere == PENDING, (
        f"benchmarks no test runs at their smallest size: {sorted(scripts - here - elsewhere - PENDING)}"
    )
    for script in scripts - PENDING:  # a quick size the test suite can run, said in --help
        assert "--quick" in (SCRIPTS / script).read_text(), f"{script} has no --quick"
