#!/usr/bin/env bash
# Regenerate manifests/ (the rendered examples).
set -euo pipefail
cd "$(dirname "$0")/.."
IMG="radixark/miles:latest@sha256:$(printf '0%.0s' {1..64})"
MR=.venv/bin/miles-ray
"$MR" render -F all --nodes 4 --name miles-qwen3-4b --image "$IMG" --ray-version 2.60.0 --out manifests/
"$MR" render -F all --recipe Qwen3-4B --nodes 4 --layout disaggregated --rollout-nodes 2 \
  --name miles-qwen3-4b-disagg --image "$IMG" --ray-version 2.60.0 --out manifests/
