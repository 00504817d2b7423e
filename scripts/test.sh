#!/usr/bin/env bash
# Set up everything the test suite needs, then run all of it:
#   unit tests (pure core, CLI), integration tests (real Ray with fake GPUs, a real Polyaxon API server),
#   end-to-end tests (a real Kubernetes control plane with fake GPU nodes and the real KubeRay operator).
# Extra arguments go to pytest, e.g. scripts/test.sh tests/unit -x, or scripts/test.sh -m ray (README:
# "Run one tier"). With CI=true a skipped test is a failure (MILESRAY_TEST_STRICT=1, tests/infra/knobs.py).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/bootstrap.sh                      # project venv, pinned (constraints.txt)
if [ -x scripts/test-tools.sh ]; then
  scripts/test-tools.sh                   # lint tools the tests run (shellcheck, actionlint)
fi
scripts/haupt-venv.sh >/dev/null          # Polyaxon API server venv (cached outside the repo)
if command -v go >/dev/null 2>&1 || cluster/build.sh --check >/dev/null 2>&1; then
  cluster/build.sh                        # control-plane binaries from Go modules (cached by version)
  if command -v go >/dev/null 2>&1; then
    cluster/build.sh kueue                # Kueue's manager for tests/e2e/test_queues.py (cached by version)
  fi
else
  echo "test.sh: WARNING: no Go toolchain and no cached control plane: the e2e tier will be skipped" >&2
fi

if [ "${CI:-}" = "true" ]; then
  export MILESRAY_TEST_STRICT=1           # in CI a skipped tier (its real component missing) is a failure
fi
export RAY_USAGE_STATS_ENABLED=0

set +e
.venv/bin/python -m pytest "${@:-tests}" -p no:cacheprovider --durations=25
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
