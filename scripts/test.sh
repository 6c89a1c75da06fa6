#!/usr/bin/env bash
# Set up (see setup.sh), then lint and run the whole test suite (unit and end-to-end: the
# end-to-end tests start their own Redis Cluster, gRPC servers and role processes).
# Extra arguments go to pytest, e.g. ./scripts/test.sh -m "not e2e"
set -euo pipefail
export FLEETRL_SETUP_SLURM=1  # setup.sh also installs Slurm and munge: tests/test_slurm.py runs a real job
export FLEETRL_SETUP_BROWSER=1  # ... and Chromium: tests/test_docs_site.py opens every page of the built site
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
ruff check .
ruff format --check .
mypy  # files and settings: [tool.mypy] in pyproject.toml
lint-imports  # the layers and the role-to-role edges: [tool.importlinter] in pyproject.toml
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir site  # the docs site (mkdocs.yml); a warning fails
exec python -m pytest -q -rs --durations=15 "$@"  # -rs: every skip with its reason; the 15 slowest tests last
