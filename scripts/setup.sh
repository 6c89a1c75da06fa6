#!/usr/bin/env bash
# Sets up fleetrl on a fresh Debian/Ubuntu machine; sourced by train.sh and test.sh.
#   - redis-server (Debian package) for the local Redis Cluster (unless FLEETRL_SETUP_REDIS=0:
#     test.sh --fast starts none), python3-venv if missing
#   - with FLEETRL_SETUP_SLURM=1 (scripts/test.sh sets it): Slurm and munge (Debian packages, a few
#     MB) for tests/test_slurm.py, which starts its own daemons; train.sh leaves them out
#   - with FLEETRL_SETUP_BROWSER=1 (scripts/test.sh sets it): Chromium and its driver (Debian packages
#     chromium, chromium-driver) for tests/test_docs_site.py, which opens every page of the docs site
#   - .venv with every Python dependency resolved in ONE pip command: torch 2.13.0 (CPU),
#     mujoco 3.3.0 and gymnasium-robotics must be resolved together or mujoco ends up broken.
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

apt_needed=()
[ "${FLEETRL_SETUP_REDIS:-1}" = 0 ] || command -v redis-server >/dev/null 2>&1 || apt_needed+=(redis-server)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || apt_needed+=(python3-venv python3-pip)
if [ ${#apt_needed[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "fleetrl setup: installing ${apt_needed[*]} with apt-get" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${apt_needed[@]}" >/dev/null
fi
test_apt_needed=()
if [ "${FLEETRL_SETUP_SLURM:-0}" = 1 ]; then
  for tool in slurmctld slurmd sbatch munged; do
    command -v "$tool" >/dev/null 2>&1 || test_apt_needed=(slurmctld slurmd slurm-client munge)
  done
fi
if [ "${FLEETRL_SETUP_BROWSER:-0}" = 1 ] && ! command -v chromium >/dev/null 2>&1; then
  test_apt_needed+=(chromium chromium-driver)
fi
if [ ${#test_apt_needed[@]} -gt 0 ]; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  echo "fleetrl setup: installing ${test_apt_needed[*]} with apt-get (test-only: tests/test_slurm.py, tests/test_docs_site.py)" >&2
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${test_apt_needed[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "fleetrl setup: creating .venv" >&2
  python3 -m venv .venv
fi
stamp=.venv/.fleetrl-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "fleetrl setup: installing Python dependencies into .venv (first run: a few minutes)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
  touch "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
