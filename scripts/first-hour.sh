#!/usr/bin/env bash
# The README's first steps ("The first hour"), exactly as a newcomer types them, on the embedded local
# cluster: start a cluster, see it, rehearse a run on it, reach it with Ray's own tools, take it down.
# Nothing but the README's commands: `miles-ray` and `ray` are whatever is on PATH (scripts/bootstrap.sh's
# .venv/bin when there is none). Exits 0 when every step worked. tests/integration/test_first_hour.py runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v miles-ray >/dev/null; then
  scripts/bootstrap.sh
  export PATH="$PWD/.venv/bin:$PATH"
fi
export RAY_USAGE_STATS_ENABLED=0
STATE=$(mktemp -d /tmp/miles-ray-first-hour.XXXXXX)
export MILES_RAY_STATE_DIR="$STATE"   # this script keeps its clusters and runs out of your own
unset RAY_ADDRESS RAY_API_SERVER_ADDRESS RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH RAY_AUTH_TOKEN
cleanup() {
  miles-ray down --backend local --name ux >/dev/null 2>&1 || true
  rm -rf "$STATE"
}
trap cleanup EXIT

set -x
miles-ray up --backend local --name ux --nodes 2      # becomes the current cluster
miles-ray clusters                                     # * marks the current one
miles-ray status                                       # the current cluster: no --name, no --backend
miles-ray submit --rehearse --nodes 2 --run first-hour
eval "$(miles-ray env)"                                # Ray's own tools: address and token file
ray job list
ray status
miles-ray down
miles-ray clusters
