#!/usr/bin/env bash
# Idempotent machine + project setup: system packages, a venv with farm, the CLIs.
# Usage: bash scripts/setup.sh   (env: FARM_VENV=.venv by default)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${FARM_VENV:-.venv}"

# bubblewrap isolates local sandboxes; socat relays a sandbox's gateway port to its own
# unix socket (the sandbox has no other network); fuse-overlayfs gives sandboxes their
# copy-on-write view of an environment snapshot when farm does not run as root; chromium
# (headless) renders `farm report`'s page in its browser test; prometheus scrapes a real Ray in
# the dashboard test (tests/farm/test_farm_dashboard.py). The image tests (tests/images) run a
# real registry (docker-registry), push the images they build with skopeo, build them from
# this host's packages (python3-pytest in them) and run the CLIs on a libc-less one (busybox-static).
# Debian packages.
if ! command -v bwrap >/dev/null 2>&1 || ! command -v socat >/dev/null 2>&1 || ! command -v fuse-overlayfs >/dev/null 2>&1 \
   || [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/prometheus ] || ! command -v docker-registry >/dev/null 2>&1 \
   || ! command -v skopeo >/dev/null 2>&1 || [ ! -x /bin/busybox ] || ! dpkg -s python3-pytest >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq bubblewrap socat git fuse-overlayfs chromium >/dev/null
  $SUDO apt-get install -y -qq docker-registry skopeo busybox-static python3-pytest >/dev/null
  # prometheus alone (not the node exporter it recommends); the test runs its own server. On a
  # host with systemd the package also enables a service on :9090 (systemctl disable --now prometheus).
  $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# constraints.txt pins every version (refresh: bash scripts/lock.sh): the same install twice.
"$VENV/bin/python" -m pip install -q -c constraints.txt -e '.[dev]'

# Prefetch the pinned coding-agent CLIs into farm's shared npm cache (once per machine).
if "$VENV/bin/python" -c "import farm.harnesses.install" 2>/dev/null; then
  "$VENV/bin/python" -m farm.harnesses.install
fi
echo "setup: ok ($VENV)"
