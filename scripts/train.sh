#!/usr/bin/env bash
# Set up (see setup.sh), then train FetchReach with the complete local fleet.
# Extra arguments go to `fleetrl train`, e.g. ./scripts/train.sh --task FetchPush-v4 --samplers 2
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
exec fleetrl train --task FetchReach-v4 "$@"
