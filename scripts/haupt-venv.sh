#!/usr/bin/env bash
# Create (once) the separate virtual environment that holds the real Polyaxon API server (haupt)
# used by the integration tests. It is NOT the project venv: haupt is a Django server, not a
# dependency of miles-ray.
#
#   scripts/haupt-venv.sh          # create if missing, then print the venv path
#   HAUPT_VENV=/some/dir scripts/haupt-venv.sh
#
# Idempotent: a complete venv is marked with a stamp file naming the pinned versions; a venv without
# the stamp (interrupted install) is removed and rebuilt. Concurrent callers serialise on a lock.
set -euo pipefail

HAUPT_VERSION="${HAUPT_VERSION:-2.18.0}"
POLYAXON_VERSION="${POLYAXON_VERSION:-2.18.0}"
CACHE_DIR="${MILESRAY_TEST_CACHE:-$HOME/.cache/miles-ray}"
VENV="${HAUPT_VENV:-$CACHE_DIR/haupt-venv}"
PYTHON="${HAUPT_PYTHON:-python3.11}"
STAMP="$VENV/.miles-ray-stamp"
WANT="haupt[sandbox]==$HAUPT_VERSION polyaxon==$POLYAXON_VERSION"

command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then flock 9; fi

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VENV/bin/haupt" ]]; then
  echo "$VENV"
  exit 0
fi

echo "haupt-venv: creating $VENV ($WANT)" >&2
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
# uv, at the project's pin (constraints.txt, as bootstrap.sh installs it), installs it several times faster than
# pip; pip is the fallback
# shellcheck disable=SC2086
if ! { "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
         -c "$(dirname "$0")/../constraints.txt" uv >&2 \
       && "$VENV/bin/python" -m uv pip install --quiet --compile-bytecode --python "$VENV/bin/python" $WANT >&2; }; then
  echo "haupt-venv: uv could not install it (above); installing with pip instead" >&2
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $WANT >&2
fi
"$VENV/bin/haupt" --help >/dev/null
printf '%s' "$WANT" >"$STAMP"
echo "$VENV"
