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
"$VENV/bin/python" -m pytest -q -ra --durations=15 "${select[@]}" "$@"
rc=$?
# pytest exit 5 = "no tests ran": that is a failure of ours, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests ran: failing" >&2; exit 1; fi
exit "$rc"
