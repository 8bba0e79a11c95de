#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. Extra args go to pytest.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
VENV="${FARM_VENV:-.venv}"
"$VENV/bin/python" -m pytest -q -ra --durations=15 "$@"
rc=$?
# pytest exit 5 = "no tests ran": that is a failure of ours, not a pass.
if [ "$rc" -eq 5 ]; then echo "no tests ran: failing" >&2; exit 1; fi
exit "$rc"
