#!/usr/bin/env bash
# The main job on the embedded default, no Kubernetes needed: install, plan a split, start a real local
# Ray cluster with 4 fake 8-GPU nodes, rehearse Qwen3-4B colocated on 2 and 4 nodes and disaggregated on
# 4 nodes (real placement groups and actors, one per GPU bundle), list the runs, and stop the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
export RAY_USAGE_STATS_ENABLED=0
MR=".venv/bin/miles-ray"
NAME="miles-demo"
STATE=$(mktemp -d /tmp/miles-ray-demo.XXXXXX)
export MILES_RAY_STATE_DIR="$STATE"   # the demo keeps its state (runs, cluster) out of your own
cleanup() {
  "$MR" down --backend local --name "$NAME" >/dev/null 2>&1 || true
  rm -rf "$STATE"
}
trap cleanup EXIT

set -x
"$MR" plan --recipe Qwen3-4B --nodes 4
"$MR" plan --recipe Qwen3-4B --nodes 3 || true          # infeasible: names the rule and the nearest fixes
"$MR" up --backend local --nodes 4 --name "$NAME"
"$MR" submit --rehearse --recipe Qwen3-4B --nodes 2 --name "$NAME" --run demo-colocated-2
"$MR" submit --rehearse --recipe Qwen3-4B --nodes 4 --name "$NAME" --run demo-colocated-4
"$MR" submit --rehearse --recipe Qwen3-4B --nodes 4 --layout disaggregated --rollout-nodes 2 --name "$NAME" --run demo-disagg-4
"$MR" runs
"$MR" status --name "$NAME"
"$MR" down --backend local --name "$NAME"
