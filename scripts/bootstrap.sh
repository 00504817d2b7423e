#!/usr/bin/env bash
# Create or refresh the project venv (.venv) with pinned versions (constraints.txt). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "bootstrap: creating .venv with $($PY --version)" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.miles-ray-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing miles-ray and its pinned dependencies (first run takes ~25 s with uv, ~1.5 min with pip)" >&2
  # uv (pinned in constraints.txt) installs the same pinned set as pip, several times faster (parallel
  # downloads and unpacking). pip stays the fallback: a machine where uv cannot be had still gets the venv.
  # --compile-bytecode, as pip does by default: Ray's processes never write .pyc files, so without them every
  # Ray worker compiles ray's modules from source (measured: the check-data tests took 2.3x as long).
  if .venv/bin/python -m pip install -q -c constraints.txt uv \
      && .venv/bin/python -m uv pip install -q --compile-bytecode --python .venv/bin/python -c constraints.txt -e ".[test]"; then
    :
  else
    echo "bootstrap: uv could not install the venv (above); installing with pip instead" >&2
    .venv/bin/python -m pip install -q -c constraints.txt -e ".[test]"
  fi
  echo "$want" > "$stamp"
fi
