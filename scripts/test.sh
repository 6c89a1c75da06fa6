#!/usr/bin/env bash
# Set up (see setup.sh), then lint and run the whole test suite (unit and end-to-end: the
# end-to-end tests start their own Redis Cluster, gRPC servers and role processes).
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m "not e2e"
#   ./scripts/test.sh --fast    lint, then only the fast tier (pure logic with fakes, minutes):
#                               no redis-server or Slurm to install (tests/tiers.py: the tiers)
set -euo pipefail
tier=()
if [ "${1:-}" = "--fast" ]; then
  shift
  tier=(-m fast)
  export FLEETRL_SETUP_REDIS=0  # the fast tier starts no Redis (its guard fails a test that does)
else
  export FLEETRL_SETUP_SLURM=1  # setup.sh also installs Slurm and munge: tests/test_slurm.py runs a real job
  export FLEETRL_SETUP_BROWSER=1  # ... and Chromium: tests/test_docs_site.py opens every page of the built site
fi
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
ruff check .
ruff format --check .
mypy  # files and settings: [tool.mypy] in pyproject.toml
lint-imports  # the layers and the role-to-role edges: [tool.importlinter] in pyproject.toml
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir site  # the docs site (mkdocs.yml); a warning fails
exec python -m pytest -q -rs --durations=15 "${tier[@]}" "$@"  # -rs: every skip with its reason; the 15 slowest tests last
