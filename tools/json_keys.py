"""Print the key paths of every verb's ``-o json`` that runs without a cluster, so two commits can be compared key for
key (``diff`` the output of each)::

    .venv/bin/python tools/json_keys.py > keys-now.txt
    diff tests/data/json_keys_before.txt keys-now.txt

What it runs: the verbs that need no cluster (plan, render, up/submit ``--dry-run client``, recipes, init, clusters),
and the run verbs (status, logs, runs, runs outputs, runs compare, doctor, stop) on the run records of
tests/data/records/ (written by an older main, their cluster gone). One line per key path: ``LABEL<TAB>PATH``, a
list's items as ``[]`` (the union of their keys); a non-JSON answer says ``(not json, exit N)``. Sorted, no values:
a key added, gone or renamed shows as a line in a diff."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "tests" / "data" / "records"
IMAGE = ["--image", "radixark/miles:latest@sha256:" + "3f" * 32, "--ray-version", "2.54.0"]  # an example digest
CLOSED = "http://127.0.0.1:9"  # nothing answers there: a client dry run contacts nothing anyway
SUBMIT = ["submit", "--address", CLOSED, "--recipe", "Qwen3-4B", "--nodes", "1", "--run", "keys-1", "--dry-run",
          "client", "-o", "json"]

NO_CLUSTER: dict[str, list[str]] = {
    "plan": ["plan", "--recipe", "Qwen3-4B", "--nodes", "2", "-o", "json"],
    "plan disaggregated": ["plan", "--recipe", "Qwen3-4B", "--nodes", "2", "--layout", "disaggregated",
                           "--rollout-nodes", "1", "-o", "json"],
    "render": ["render", "--nodes", "2", *IMAGE, "-o", "json"],
    "render --single-node": ["render", "--single-node", *IMAGE, "-o", "json"],
    "up --dry-run client (kuberay)": ["up", "--backend", "kubernetes", "--via", "kuberay", "--nodes", "2", *IMAGE,
                                      "--dry-run", "client", "-o", "json"],
    "up --dry-run client (polyaxon)": ["up", "--backend", "kubernetes", "--via", "polyaxon", "--nodes", "2", *IMAGE,
                                       "--dry-run", "client", "-o", "json"],
    "submit --dry-run client": SUBMIT,
    "submit --dry-run client --rehearse": [*SUBMIT, "--rehearse"],
    "submit --dry-run client --mode launcher": [*SUBMIT, "--mode", "launcher"],
    "recipes": ["recipes", "-o", "json"],
    "recipes --fits": ["recipes", "--fits", "2x8", "-o", "json"],
    "init": ["init", "-o", "json"],
    "clusters": ["clusters", "-o", "json"],
}
ON_RECORDS: dict[str, list[str]] = {
    "status RUN": ["status", "{run}", "-o", "json"],
    "logs RUN": ["logs", "{run}", "-o", "json"],
    "runs": ["runs", "-o", "json"],
    "runs outputs RUN": ["runs", "outputs", "{run}", "-o", "json"],
    "doctor RUN": ["doctor", "{run}", "-o", "json"],
}


def key_paths(value: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            yield path
            yield from key_paths(v, path)
    elif isinstance(value, list):
        for item in value:
            yield from key_paths(item, f"{prefix}[]")


def run_cli(args: list[str]) -> tuple[int, str]:
    from miles_ray.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue()


def keys_of(label: str, args: list[str]) -> list[str]:
    code, out = run_cli(args)
    try:
        doc = json.loads(out)
    except ValueError:
        return [f"{label}\t(not json, exit {code})"]
    return sorted({f"{label}\t{p}" for p in key_paths(doc)} | {f"{label}\t(exit {code})"})


def all_keys(cases: list[str] | None = None) -> list[str]:
    """Every line, from a clean environment: an empty state dir and an empty cwd for the no-cluster verbs, each
    record case's copy for the run verbs (``cases``: those cases only; None: all)."""
    from tests.unit.test_records_from_older_main import CASES, KUBECONFIG

    lines: list[str] = []
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory(prefix="json-keys-") as tmp:
        try:
            for key in [k for k in os.environ if k.startswith(("MILES_RAY_", "RAY_", "POLYAXON_"))]:
                del os.environ[key]
            (Path(tmp) / "kubeconfig").write_text(KUBECONFIG)  # a Kubernetes API server that is gone
            os.environ.update(MILES_RAY_STATE_DIR=str(Path(tmp) / "state"), KUBECONFIG=str(Path(tmp) / "kubeconfig"))
            for label, args in NO_CLUSTER.items():
                cwd = Path(tmp) / label.replace(" ", "_").replace("(", "").replace(")", "")
                cwd.mkdir()
                os.chdir(cwd)
                lines += keys_of(label, args)
            for case, run in CASES.items():
                if cases is not None and case not in cases:
                    continue
                state = Path(tmp) / f"state-{case}"
                shutil.copytree(RECORDS / case, state, ignore=shutil.ignore_patterns("golden"))
                os.environ["MILES_RAY_STATE_DIR"] = str(state)
                for label, args in ON_RECORDS.items():
                    lines += keys_of(f"{label} ({case})", [a.format(run=run) for a in args])
            both = ("supervised_local", "polyaxon_tracked")
            if cases is None or set(both) <= set(cases):
                os.environ["MILES_RAY_STATE_DIR"] = str(Path(tmp) / "state-both")
                for case in both:
                    shutil.copytree(RECORDS / case, Path(tmp) / "state-both", ignore=shutil.ignore_patterns("golden"),
                                    dirs_exist_ok=True)
                lines += keys_of("runs compare", ["runs", "compare", *(CASES[c] for c in both), "-o", "json"])
        finally:
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    return lines


def main() -> int:
    sys.path.insert(0, str(REPO))
    print(f"# tools/json_keys.py at {_commit()}")
    print("\n".join(all_keys()))
    return 0


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    raise SystemExit(main())
