#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. Extra args go to pytest.
# `--fast` first: only the tests not marked slow (no real CLIs, Ray clusters or router
# binary end to end), for your own loop; CI runs everything.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
VENV="${FARM_VENV:-.venv}"
select=()
if [ "${1:-}" = "--fast" ]; then shift; select=(-m "not slow"); fi
# The suite runs on FARM_TEST_WORKERS pytest-xdist workers (2 by default; 0 runs it serially
# in this process) with `--dist loadgroup`: tests/conftest.py puts every test that starts a Ray
# on one worker, one at a time (two Rays starting at once on 2 cores timed out), keeps on one
# worker each module whose module-scoped run must be made once, and sends the Ray tests and the
# slow tests first; the other worker runs the rest beside them (docs/developing/index.md).
n_workers="${FARM_TEST_WORKERS:-2}"
workers=()
if [ "$n_workers" != "0" ]; then workers=(-n "$n_workers" --dist loadgroup); fi
# pytest ends as `python -m pytest` does: the interpreter's teardown included (docs/developing/index.md
# says why nothing hides it any more)
"$VENV/bin/python" -m pytest -q -ra --durations=15 "${workers[@]}" "${select[@]}" "$@"
rc=$?
# pytest exit 5 = "no tests ran": that is a failure of ours, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests ran: failing" >&2; exit 1; fi
exit "$rc"
